//! Driving every partition of a topic from outside: wait until each has
//! one primary everywhere ([`wait_for_layout`]), then send each a batch
//! until it is acknowledged ([`probe_until_each_accepts`]). Shared by the
//! failover and memory modes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use iggy::prelude::IggyClient;
use tokio::task::JoinSet;

use super::process::Cluster;
use super::{ClusterError, METADATA_GROUP, primaries, wait_for};
use crate::actors::{self, Target};
use crate::error::BenchError;
use crate::plan::Plan;

/// Between two rounds of a prober over the partitions still refusing.
const PROBE_PAUSE: Duration = Duration::from_millis(5);

/// Every partition's group and the replica that leads it.
pub(super) struct Layout {
    /// By partition id: (group, primary).
    pub partitions: Vec<(String, usize)>,
    /// Group 0's primary.
    pub metadata_primary: Option<usize>,
}

/// Waits until every replica holds every partition, in the same group,
/// each group normal with exactly one primary.
pub(super) async fn wait_for_layout(
    partitions: u32,
    timeout: Duration,
    cluster: &mut Cluster,
    stream_id: u32,
    topic_id: u32,
) -> Result<Layout, ClusterError> {
    let want = partitions as usize;
    wait_for(
        timeout,
        cluster,
        "every partition's group on every replica, each with one primary",
        |scrapes| {
            let maps: Vec<_> = scrapes
                .iter()
                .map(|s| s.partition_groups(stream_id, topic_id))
                .collect();
            let held: Vec<usize> = maps.iter().map(|m| m.len()).collect();
            if held.iter().any(|n| *n != want) || maps.iter().any(|m| *m != maps[0]) {
                return Err(format!("partitions held per replica {held:?} of {want}"));
            }
            let leads: Vec<_> = scrapes
                .iter()
                .map(|s| s.per_group("replog_group_primary"))
                .collect();
            let status: Vec<_> = scrapes
                .iter()
                .map(|s| s.per_group("replog_group_status"))
                .collect();
            let mut partitions = Vec::with_capacity(want);
            for (partition, group) in &maps[0] {
                if *partition as usize != partitions.len() {
                    return Err(format!("partition ids are not 0..{want}: {partition}"));
                }
                let primary: Vec<usize> = (0..scrapes.len())
                    .filter(|&r| leads[r].get(group).is_some_and(|v| *v == 1.0))
                    .collect();
                let normal = status.iter().all(|s| s.get(group) == Some(&0.0));
                match primary.as_slice() {
                    [p] if normal => partitions.push((group.clone(), *p)),
                    _ => {
                        return Err(format!(
                            "partition {partition} (group {group}): primaries {primary:?}, normal everywhere: {normal}"
                        ));
                    }
                }
            }
            let metadata_primary = primaries(scrapes, METADATA_GROUP).first().copied();
            Ok(Layout {
                partitions,
                metadata_primary,
            })
        },
    )
    .await
}

/// A prober's client and the plan it was connected with.
pub(super) struct Prober {
    client: Arc<IggyClient>,
    plan: Arc<Plan>,
}

/// One logged-in client per plan.
pub(super) async fn connect_probers(
    plans: impl Iterator<Item = Plan>,
) -> Result<Vec<Prober>, ClusterError> {
    let mut out = Vec::new();
    for probe_plan in plans {
        let client = actors::connect(&probe_plan)
            .await
            .map_err(|e| ClusterError::Clients {
                what: "connecting the probers",
                source: Box::new(e),
            })?;
        out.push(Prober {
            client: Arc::new(client),
            plan: Arc::new(probe_plan),
        });
    }
    Ok(out)
}

/// Sends one small batch to each of `partitions` until each has been
/// acknowledged once (or `timeout` passes), prober `i` taking every
/// `probers`-th partition of the list, in its order; per partition, the
/// seconds from `since` to its acknowledgement.
///
/// A prober sends one batch at a time, and the SDK retries a refused
/// produce (status 58, no primary) every 50 ms for a while before it
/// returns the error, so a send to a partition that has no primary blocks
/// the prober's next partitions: list the partitions expected to be
/// unaffected first, so their times are not charged the others' wait. A
/// time measured behind another partition's wait is late, never early.
pub(super) async fn probe_until_each_accepts(
    probers: &[Prober],
    partitions: &[u32],
    since: Instant,
    timeout: Duration,
) -> Result<Vec<(u32, f64)>, ClusterError> {
    let deadline = since + timeout;
    let mut set = JoinSet::new();
    for (i, prober) in probers.iter().enumerate() {
        let mine: Vec<u32> = partitions
            .iter()
            .copied()
            .skip(i)
            .step_by(probers.len())
            .collect();
        let client = Arc::clone(&prober.client);
        let probe_plan = Arc::clone(&prober.plan);
        set.spawn(async move {
            let mut messages = actors::batch(&probe_plan)?;
            let mut left = mine;
            let mut done = Vec::with_capacity(left.len());
            while !left.is_empty() && Instant::now() < deadline {
                let mut still = Vec::new();
                for p in left {
                    let target = Target {
                        stream: Plan::stream_name(0),
                        partition: Some(p),
                    };
                    match actors::send_batch(&client, &probe_plan, &target, &mut messages, None)
                        .await
                    {
                        Ok(()) => done.push((p, since.elapsed().as_secs_f64())),
                        Err(_) => still.push(p),
                    }
                }
                left = still;
                if !left.is_empty() {
                    tokio::time::sleep(PROBE_PAUSE).await;
                }
            }
            Ok::<_, BenchError>(done)
        });
    }
    let mut out = Vec::with_capacity(partitions.len());
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok(done)) => out.extend(done),
            Ok(Err(e)) => {
                return Err(ClusterError::Clients {
                    what: "probing the partitions",
                    source: Box::new(e),
                });
            }
            Err(e) => {
                return Err(ClusterError::Clients {
                    what: "probing the partitions",
                    source: Box::new(BenchError::Actor(e.to_string())),
                });
            }
        }
    }
    out.sort_by_key(|(p, _)| *p);
    Ok(out)
}
