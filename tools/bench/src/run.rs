//! One run: fresh streams and topics, the fill for the consumer modes (not
//! measured), the actors, the progress bar, the report.

use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use iggy::prelude::*;
use indicatif::{ProgressBar, ProgressStyle};
use tokio::task::JoinSet;

use crate::actors::{self, ActorOutcome, Shared, Target};
use crate::args::DurabilityArg;
use crate::baseline::Receiver;
use crate::error::BenchError;
use crate::plan::{GROUP, Kind, Plan, TOPIC};
use crate::report::Report;

/// Runs `plan` against its server and reports.
pub async fn run(plan: Plan) -> Result<Report, BenchError> {
    if plan.kind == Kind::Baseline {
        return run_baseline(plan).await;
    }
    let admin = actors::connect(&plan).await?;
    prepare_topics(&admin, &plan).await?;
    if !plan.kind.measures_producers() {
        fill(&plan).await?;
    }
    let outcomes = measure(&plan).await?;
    if plan.cleanup {
        for s in 0..plan.streams {
            delete_stream_if_present(&admin, &plan, &Plan::stream_name(s)).await?;
        }
    }
    Ok(Report::new(plan, &outcomes))
}

/// The baseline: the receiver starts in this process and the producers,
/// exactly as in pinned-producer, send to it. There is no stream set-up
/// (the receiver serves none) and nothing to clean up.
async fn run_baseline(mut plan: Plan) -> Result<Report, BenchError> {
    let receiver = Receiver::start(plan.baseline_dir.as_deref())?;
    plan.addr = receiver.addr();
    let measured = measure(&plan).await;
    // Joining its threads blocks: off the runtime's workers.
    let stopped = tokio::task::spawn_blocking(move || receiver.stop())
        .await
        .map_err(|e| BenchError::Actor(format!("stopping the baseline receiver: {e}")))?;
    let outcomes = measured?;
    Ok(Report::new(plan, &outcomes).with_receiver(stopped?))
}

async fn delete_stream_if_present(
    admin: &IggyClient,
    plan: &Plan,
    name: &str,
) -> Result<(), BenchError> {
    let id = actors::ident(name)?;
    let found = admin
        .get_stream(&id)
        .await
        .map_err(|source| BenchError::Setup {
            what: format!("looking up stream {name} on {}", plan.addr),
            source: Box::new(source),
        })?;
    if found.is_some() {
        admin
            .delete_stream(&id)
            .await
            .map_err(|source| BenchError::Setup {
                what: format!("deleting stream {name} on {}", plan.addr),
                source: Box::new(source),
            })?;
    }
    Ok(())
}

/// Every run starts from empty topics: the bench's streams of an earlier
/// run are deleted and created again.
async fn prepare_topics(admin: &IggyClient, plan: &Plan) -> Result<(), BenchError> {
    let durability = match plan.durability {
        DurabilityArg::Replicated => Durability::Replicated,
        DurabilityArg::Persisted => Durability::Persisted,
    };
    for s in 0..plan.streams {
        let name = Plan::stream_name(s);
        delete_stream_if_present(admin, plan, &name).await?;
        admin
            .create_stream(&name)
            .await
            .map_err(|source| BenchError::Setup {
                what: format!("creating stream {name} on {}", plan.addr),
                source: Box::new(source),
            })?;
        let options = TopicCreateOptions {
            partitions_count: Some(plan.partitions),
            durability,
            ..TopicCreateOptions::default()
        };
        admin
            .create_topic(&actors::ident(&name)?, TOPIC, &options)
            .await
            .map_err(|source| BenchError::Setup {
                what: format!(
                    "creating topic {TOPIC} with {} partitions in stream {name} on {}",
                    plan.partitions, plan.addr
                ),
                source: Box::new(source),
            })?;
        if plan.kind == Kind::BalancedConsumerGroup {
            admin
                .create_consumer_group(&actors::ident(&name)?, &actors::ident(TOPIC)?, GROUP)
                .await
                .map_err(|source| BenchError::Setup {
                    what: format!(
                        "creating consumer group {GROUP} on stream {name} topic {TOPIC} on {}",
                        plan.addr
                    ),
                    source: Box::new(source),
                })?;
        }
    }
    Ok(())
}

/// The consumer modes read what this writes first: for a pinned consumer,
/// its share into its own partition; for a group, its stream's share spread
/// evenly over the partitions. One client per partition, concurrently.
async fn fill(plan: &Plan) -> Result<(), BenchError> {
    let per_actor = plan.batches_per_actor;
    let mut jobs: Vec<(Target, u64)> = Vec::new();
    match plan.kind {
        Kind::PinnedConsumer => {
            for a in 0..plan.actors {
                let (s, p) = plan.pinned_target(a);
                jobs.push((
                    Target {
                        stream: Plan::stream_name(s),
                        partition: Some(p),
                    },
                    per_actor,
                ));
            }
        }
        Kind::BalancedConsumerGroup => {
            for s in 0..plan.streams {
                let batches = per_actor * u64::from(plan.actors_on_stream(s));
                for (p, share) in (0..).zip(partition_shares(batches, plan.partitions)) {
                    jobs.push((
                        Target {
                            stream: Plan::stream_name(s),
                            partition: Some(p),
                        },
                        share,
                    ));
                }
            }
        }
        _ => return Ok(()),
    }
    let mut set = JoinSet::new();
    for (target, batches) in jobs {
        let plan = plan.clone();
        set.spawn(async move {
            let client = actors::connect(&plan).await?;
            let mut messages = actors::batch(&plan)?;
            for _ in 0..batches {
                actors::send_batch(&client, &plan, &target, &mut messages, None).await?;
            }
            Ok::<(), BenchError>(())
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.map_err(|e| BenchError::Actor(e.to_string()))??;
    }
    Ok(())
}

/// How many of a stream's `batches` each of its `partitions` gets: batch b
/// goes to partition b mod partitions, so the shares differ by at most one
/// and add up to `batches`.
fn partition_shares(batches: u64, partitions: u32) -> Vec<u64> {
    let parts = u64::from(partitions.max(1));
    (0..parts)
        .map(|p| batches / parts + u64::from(p < batches % parts))
        .collect()
}

/// Spawns the actors, shows progress on a terminal, collects the outcomes.
async fn measure(plan: &Plan) -> Result<Vec<ActorOutcome>, BenchError> {
    let tasks = match plan.kind {
        Kind::EndToEnd => 2 * plan.actors as usize,
        _ => plan.actors as usize,
    };
    let shared = Arc::new(Shared::new(plan.clone(), tasks));
    let mut set = JoinSet::new();
    let group_counters: Vec<Arc<AtomicU64>> = (0..plan.streams)
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    for a in 0..plan.actors {
        let shared = shared.clone();
        match plan.kind {
            Kind::PinnedProducer | Kind::Baseline => {
                let (s, p) = plan.pinned_target(a);
                let target = pinned(s, p);
                set.spawn(actors::producer(shared, a, target, None));
            }
            Kind::BalancedProducer => {
                let target = Target {
                    stream: Plan::stream_name(plan.balanced_stream(a)),
                    partition: None,
                };
                set.spawn(actors::producer(shared, a, target, None));
            }
            Kind::PinnedConsumer => {
                let (s, p) = plan.pinned_target(a);
                set.spawn(actors::pinned_consumer(shared, a, pinned(s, p)));
            }
            Kind::BalancedConsumerGroup => {
                let s = plan.balanced_stream(a);
                let want = u64::from(plan.actors_on_stream(s))
                    * plan.batches_per_actor
                    * u64::from(plan.messages_per_batch);
                let target = Target {
                    stream: Plan::stream_name(s),
                    partition: None,
                };
                let counter = group_counters[s as usize].clone();
                set.spawn(actors::group_consumer(shared, a, target, counter, want));
            }
            Kind::EndToEnd => {
                let (s, p) = plan.pinned_target(a);
                let warmup = Arc::new(AtomicU64::new(0));
                set.spawn(actors::producer(
                    shared.clone(),
                    a,
                    pinned(s, p),
                    Some(warmup.clone()),
                ));
                set.spawn(actors::end_to_end_consumer(shared, a, pinned(s, p), warmup));
            }
        }
    }
    let progress = progress_bar(plan, &shared);
    let mut outcomes = Vec::new();
    let mut failure = None;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(outcome)) => outcomes.push(outcome),
            Ok(Err(e)) => {
                failure.get_or_insert(e);
                // The others may wait on the barrier for the failed one.
                set.abort_all();
            }
            Err(e) if e.is_cancelled() => {}
            Err(e) => {
                failure.get_or_insert(BenchError::Actor(e.to_string()));
                set.abort_all();
            }
        }
    }
    if let Some((bar, ticker)) = progress {
        ticker.abort();
        bar.finish_and_clear();
    }
    if let Some(e) = failure {
        return Err(e);
    }
    outcomes.sort_by_key(|o| (o.index, o.role == actors::Role::Consumer));
    Ok(outcomes)
}

fn pinned(s: u32, p: u32) -> Target {
    Target {
        stream: Plan::stream_name(s),
        partition: Some(p),
    }
}

/// An indicatif bar over the measured batches, only when stdout is a
/// terminal (a pipe or a file gets the report alone).
fn progress_bar(
    plan: &Plan,
    shared: &Arc<Shared>,
) -> Option<(ProgressBar, tokio::task::JoinHandle<()>)> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let events = match plan.kind {
        // Both halves count a batch: the send and the arrival.
        Kind::EndToEnd => 2 * u64::from(plan.actors) * plan.batches_per_actor,
        // Polls may return less than a batch; the bar is approximate.
        _ => u64::from(plan.actors) * plan.batches_per_actor,
    };
    let bar = ProgressBar::new(events);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} batches ({eta} left)",
    ) {
        bar.set_style(style);
    }
    let shared = shared.clone();
    let ticking = bar.clone();
    let ticker = tokio::spawn(async move {
        loop {
            ticking.set_position(shared.batches_done.load(Ordering::Relaxed));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    Some((bar, ticker))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_batches_not_divisible_by_partitions_when_shared_should_add_up_and_differ_by_one_at_most()
     {
        assert_eq!(partition_shares(10, 4), vec![3, 3, 2, 2]);
        assert_eq!(partition_shares(2, 4), vec![1, 1, 0, 0]);
        for (batches, partitions) in [(0, 1), (7, 3), (1000, 7), (5, 5)] {
            let shares = partition_shares(batches, partitions);
            assert_eq!(shares.iter().sum::<u64>(), batches);
            let (lo, hi) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
            assert!(hi - lo <= 1, "{shares:?}");
        }
    }
}
