//! The actors: each is one SDK client (its own TCP connection) on one
//! tokio task, sending or polling batches and recording each batch's
//! latency into its own histogram. All of them start measuring together
//! (a barrier after log-in and warm-up), so the run's wall time is the
//! span from the first measured batch to the last.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use iggy::prelude::*;
use tokio::sync::Barrier;
use tokio::time::Instant;

use crate::error::BenchError;
use crate::histogram::LatencyHistogram;
use crate::plan::{GROUP, Plan, TOPIC};
use crate::schedule::Schedule;

/// A consumer that has seen nothing new for this long gives up: the data it
/// waits for is not coming.
const STALL_LIMIT: Duration = Duration::from_secs(15);

/// What an actor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Sends batches.
    Producer,
    /// Polls batches.
    Consumer,
}

/// Where an actor works.
#[derive(Debug, Clone)]
pub struct Target {
    /// The stream's name.
    pub stream: String,
    /// A fixed partition, or `None` (balanced producer, group consumer).
    pub partition: Option<u32>,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.partition {
            Some(p) => write!(f, "stream {} topic {TOPIC} partition {p}", self.stream),
            None => write!(f, "stream {} topic {TOPIC}", self.stream),
        }
    }
}

/// One actor's measured phase.
pub struct ActorOutcome {
    /// Which actor.
    pub index: u32,
    /// Producer or consumer.
    pub role: Role,
    /// Where.
    pub target: Target,
    /// Messages sent (acknowledged) or received.
    pub messages: u64,
    /// Payload bytes of those messages.
    pub payload_bytes: u64,
    /// Per-batch latencies.
    pub histogram: LatencyHistogram,
    /// The first measured batch.
    pub started: Instant,
    /// After the last one.
    pub finished: Instant,
}

/// What every actor of a run shares.
pub struct Shared {
    /// The run.
    pub plan: Plan,
    /// Released once every actor has logged in and warmed up.
    pub start: Barrier,
    /// Measured batches so far, for the progress bar.
    pub batches_done: AtomicU64,
    /// `Instant` ↔ wall clock, for the end-to-end stamps.
    pub epoch: Instant,
    /// Microseconds since the Unix epoch at `epoch`.
    pub epoch_wall_micros: u64,
}

impl Shared {
    /// Shared state for `parties` tasks that wait on the start barrier.
    pub fn new(plan: Plan, parties: usize) -> Self {
        let epoch = Instant::now();
        let epoch_wall_micros = wall_micros();
        Self {
            plan,
            start: Barrier::new(parties),
            batches_done: AtomicU64::new(0),
            epoch,
            epoch_wall_micros,
        }
    }

    fn wall_micros_at(&self, at: Instant) -> u64 {
        self.epoch_wall_micros + at.saturating_duration_since(self.epoch).as_micros() as u64
    }
}

fn wall_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A logged-in SDK client on its own connection.
pub async fn connect(plan: &Plan) -> Result<IggyClient, BenchError> {
    let addr = plan.addr;
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(addr.to_string())
        .with_no_delay()
        .with_reconnection_max_retries(Some(2))
        .build()
        .map_err(|source| BenchError::Connect {
            addr,
            source: Box::new(source),
        })?;
    client
        .connect()
        .await
        .map_err(|source| BenchError::Connect {
            addr,
            source: Box::new(source),
        })?;
    client
        .login_user(&plan.username, &plan.password)
        .await
        .map_err(|source| BenchError::Login {
            addr,
            username: plan.username.clone(),
            source: Box::new(source),
        })?;
    Ok(client)
}

/// A stream, topic or group name as an SDK identifier.
pub fn ident(name: &str) -> Result<Identifier, BenchError> {
    Identifier::named(name).map_err(|source| BenchError::Setup {
        what: format!("the name {name:?} is not a valid identifier"),
        source: Box::new(source),
    })
}

/// `messages_per_batch` messages of `message_size` payload bytes each.
pub fn batch(plan: &Plan) -> Result<Vec<IggyMessage>, BenchError> {
    let payload = bytes::Bytes::from(
        (0..plan.message_size)
            .map(|i| b'a' + (i % 26) as u8)
            .collect::<Vec<u8>>(),
    );
    (0..plan.messages_per_batch)
        .map(|_| {
            IggyMessage::builder()
                .payload(payload.clone())
                .build()
                .map_err(|source| BenchError::Setup {
                    what: format!("a {}-byte message cannot be built", plan.message_size),
                    source: Box::new(source),
                })
        })
        .collect()
}

/// Sends `messages` once to `target`: a fresh id per message (the SDK mints
/// one when it is zero), so a server that deduplicates by id keeps them all.
pub async fn send_batch(
    client: &IggyClient,
    plan: &Plan,
    target: &Target,
    messages: &mut [IggyMessage],
    origin_micros: Option<u64>,
) -> Result<(), BenchError> {
    for m in messages.iter_mut() {
        m.header.id = 0;
        if let Some(t) = origin_micros {
            m.header.origin_timestamp = t;
        }
    }
    let partitioning = match target.partition {
        Some(p) => Partitioning::partition_id(p),
        None => Partitioning::balanced(),
    };
    client
        .send_messages(
            &ident(&target.stream)?,
            &ident(TOPIC)?,
            &partitioning,
            messages,
        )
        .await
        .map_err(|source| BenchError::Send {
            addr: plan.addr,
            target: target.to_string(),
            source: Box::new(source),
        })?;
    Ok(())
}

/// A producer: warm up, wait for the others, send the measured batches.
/// `warmup_messages`, when given, is where it publishes how many messages
/// the warm-up sent (for its end-to-end consumer) before measuring.
pub async fn producer(
    shared: Arc<Shared>,
    index: u32,
    target: Target,
    warmup_messages: Option<Arc<AtomicU64>>,
) -> Result<ActorOutcome, BenchError> {
    let plan = &shared.plan;
    let client = connect(plan).await?;
    let mut messages = batch(plan)?;
    let stamp = warmup_messages.is_some();
    let mut k = 0u64;
    let warm_from = Instant::now();
    let warm_schedule =
        Schedule::for_actor(plan.rate(), plan.actors, plan.batch_bytes(), warm_from);
    while warm_from.elapsed() < plan.warmup {
        let from = warm_schedule.wait_for(k).await;
        let origin = stamp.then(|| shared.wall_micros_at(from));
        send_batch(&client, plan, &target, &mut messages, origin).await?;
        k += 1;
    }
    if let Some(w) = &warmup_messages {
        w.store(k * u64::from(plan.messages_per_batch), Ordering::SeqCst);
    }
    shared.start.wait().await;
    let started = Instant::now();
    let schedule = Schedule::for_actor(plan.rate(), plan.actors, plan.batch_bytes(), started);
    let mut histogram = LatencyHistogram::new();
    for k in 0..plan.batches_per_actor {
        let from = schedule.wait_for(k).await;
        let origin = stamp.then(|| shared.wall_micros_at(from));
        send_batch(&client, plan, &target, &mut messages, origin).await?;
        histogram.record(from.elapsed());
        shared.batches_done.fetch_add(1, Ordering::Relaxed);
    }
    let finished = Instant::now();
    let messages = plan.batches_per_actor * u64::from(plan.messages_per_batch);
    Ok(ActorOutcome {
        index,
        role: Role::Producer,
        target,
        messages,
        payload_bytes: messages * u64::from(plan.message_size),
        histogram,
        started,
        finished,
    })
}

/// A pinned consumer: polls its partition by offset from 0, without
/// committing, `messages_per_batch` at a time, until it has read its share.
pub async fn pinned_consumer(
    shared: Arc<Shared>,
    index: u32,
    target: Target,
) -> Result<ActorOutcome, BenchError> {
    let plan = &shared.plan;
    let client = connect(plan).await?;
    let consumer =
        Consumer::new(
            Identifier::numeric(index + 1).map_err(|source| BenchError::Setup {
                what: format!("consumer id {}", index + 1),
                source: Box::new(source),
            })?,
        );
    let stream = ident(&target.stream)?;
    let topic = ident(TOPIC)?;
    let poll = |offset: u64| {
        let (client, stream, topic, consumer, target) =
            (&client, &stream, &topic, &consumer, &target);
        async move {
            client
                .poll_messages(
                    stream,
                    topic,
                    target.partition,
                    consumer,
                    &PollingStrategy::offset(offset),
                    plan.messages_per_batch,
                    false,
                )
                .await
                .map_err(|source| BenchError::Poll {
                    addr: plan.addr,
                    target: target.to_string(),
                    source: Box::new(source),
                })
        }
    };
    let warm_from = Instant::now();
    let warm_schedule =
        Schedule::for_actor(plan.rate(), plan.actors, plan.batch_bytes(), warm_from);
    let mut k = 0;
    while warm_from.elapsed() < plan.warmup {
        warm_schedule.wait_for(k).await;
        poll(0).await?;
        k += 1;
    }
    shared.start.wait().await;
    let started = Instant::now();
    let schedule = Schedule::for_actor(plan.rate(), plan.actors, plan.batch_bytes(), started);
    let want = plan.batches_per_actor * u64::from(plan.messages_per_batch);
    let mut histogram = LatencyHistogram::new();
    let (mut offset, mut payload_bytes, mut k) = (0u64, 0u64, 0u64);
    let mut last_progress = Instant::now();
    while offset < want {
        let from = schedule.wait_for(k).await;
        let polled = poll(offset).await?;
        k += 1;
        if polled.messages.is_empty() {
            if last_progress.elapsed() > STALL_LIMIT {
                return Err(BenchError::Stalled {
                    addr: plan.addr,
                    target: target.to_string(),
                    got: offset,
                    want,
                });
            }
            continue;
        }
        histogram.record(from.elapsed());
        last_progress = Instant::now();
        for m in &polled.messages {
            payload_bytes += m.payload.len() as u64;
        }
        offset = polled
            .messages
            .last()
            .map_or(offset, |m| m.header.offset + 1);
        shared.batches_done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(ActorOutcome {
        index,
        role: Role::Consumer,
        target,
        messages: offset,
        payload_bytes,
        histogram,
        started,
        finished: Instant::now(),
    })
}

/// A member of its stream's consumer group: polls `next` with auto-commit
/// wherever the group assigned it, until the members of the stream together
/// have read the stream's share (`stream_received` counts for all of them).
pub async fn group_consumer(
    shared: Arc<Shared>,
    index: u32,
    target: Target,
    stream_received: Arc<AtomicU64>,
    stream_want: u64,
) -> Result<ActorOutcome, BenchError> {
    let plan = &shared.plan;
    let client = connect(plan).await?;
    let stream = ident(&target.stream)?;
    let topic = ident(TOPIC)?;
    let group = ident(GROUP)?;
    client
        .join_consumer_group(&stream, &topic, &group)
        .await
        .map_err(|source| BenchError::Setup {
            what: format!("consumer {index} could not join group {GROUP} of {target}"),
            source: Box::new(source),
        })?;
    let consumer = Consumer::group(group);
    let poll = |strategy: PollingStrategy, commit: bool| {
        let (client, stream, topic, consumer, target) =
            (&client, &stream, &topic, &consumer, &target);
        async move {
            client
                .poll_messages(
                    stream,
                    topic,
                    None,
                    consumer,
                    &strategy,
                    plan.messages_per_batch,
                    commit,
                )
                .await
                .map_err(|source| BenchError::Poll {
                    addr: plan.addr,
                    target: format!("group {GROUP} of {target}"),
                    source: Box::new(source),
                })
        }
    };
    // Warm-up re-reads from offset 0 without committing: the group's
    // stored offsets stay where the measured phase expects them.
    let warm_from = Instant::now();
    let warm_schedule =
        Schedule::for_actor(plan.rate(), plan.actors, plan.batch_bytes(), warm_from);
    let mut k = 0;
    while warm_from.elapsed() < plan.warmup {
        warm_schedule.wait_for(k).await;
        poll(PollingStrategy::offset(0), false).await?;
        k += 1;
    }
    shared.start.wait().await;
    let started = Instant::now();
    let schedule = Schedule::for_actor(plan.rate(), plan.actors, plan.batch_bytes(), started);
    let mut histogram = LatencyHistogram::new();
    let (mut messages, mut payload_bytes, mut k) = (0u64, 0u64, 0u64);
    let mut last_progress = Instant::now();
    let mut last_seen = 0;
    loop {
        let seen = stream_received.load(Ordering::SeqCst);
        if seen >= stream_want {
            break;
        }
        if seen != last_seen {
            last_seen = seen;
            last_progress = Instant::now();
        } else if last_progress.elapsed() > STALL_LIMIT {
            return Err(BenchError::Stalled {
                addr: plan.addr,
                target: format!("group {GROUP} of {target}"),
                got: seen,
                want: stream_want,
            });
        }
        let from = schedule.wait_for(k).await;
        let polled = poll(PollingStrategy::next(), true).await?;
        k += 1;
        if polled.messages.is_empty() {
            // No partition assigned, or the assigned ones are drained.
            tokio::time::sleep(Duration::from_millis(1)).await;
            continue;
        }
        histogram.record(from.elapsed());
        let n = polled.messages.len() as u64;
        messages += n;
        payload_bytes += polled
            .messages
            .iter()
            .map(|m| m.payload.len() as u64)
            .sum::<u64>();
        stream_received.fetch_add(n, Ordering::SeqCst);
        shared.batches_done.fetch_add(1, Ordering::Relaxed);
    }
    let finished = Instant::now();
    let _ = client
        .leave_consumer_group(&stream, &topic, &ident(GROUP)?)
        .await;
    Ok(ActorOutcome {
        index,
        role: Role::Consumer,
        target,
        messages,
        payload_bytes,
        histogram,
        started,
        finished,
    })
}

/// The consuming half of an end-to-end actor: reads its partition by
/// offset as the producer fills it and records, for the first message of
/// every measured batch, the time from the batch's send (or scheduled) time
/// stamped in `origin_timestamp` to its arrival here.
pub async fn end_to_end_consumer(
    shared: Arc<Shared>,
    index: u32,
    target: Target,
    warmup_messages: Arc<AtomicU64>,
) -> Result<ActorOutcome, BenchError> {
    let plan = &shared.plan;
    let client = connect(plan).await?;
    let consumer =
        Consumer::new(
            Identifier::numeric(index + 1).map_err(|source| BenchError::Setup {
                what: format!("consumer id {}", index + 1),
                source: Box::new(source),
            })?,
        );
    let stream = ident(&target.stream)?;
    let topic = ident(TOPIC)?;
    let per_batch = u64::from(plan.messages_per_batch);
    let measured = plan.batches_per_actor * per_batch;
    shared.start.wait().await;
    // The producer published its warm-up count before the barrier.
    let skip = warmup_messages.load(Ordering::SeqCst);
    let want = skip + measured;
    let started = Instant::now();
    let mut histogram = LatencyHistogram::new();
    // The warm-up's messages are skipped, not read: reading that backlog
    // first would measure it instead of the path.
    let (mut offset, mut payload_bytes) = (skip, 0u64);
    // Up to ten batches a poll, so a consumer that fell behind catches up
    // instead of trailing the schedule by a poll per batch.
    let poll_count = plan.messages_per_batch.saturating_mul(10);
    let mut last_progress = Instant::now();
    while offset < want {
        let polled = client
            .poll_messages(
                &stream,
                &topic,
                target.partition,
                &consumer,
                &PollingStrategy::offset(offset),
                poll_count,
                false,
            )
            .await
            .map_err(|source| BenchError::Poll {
                addr: plan.addr,
                target: target.to_string(),
                source: Box::new(source),
            })?;
        let arrived = wall_micros();
        if polled.messages.is_empty() {
            if last_progress.elapsed() > STALL_LIMIT {
                return Err(BenchError::Stalled {
                    addr: plan.addr,
                    target: target.to_string(),
                    got: offset.saturating_sub(skip),
                    want: measured,
                });
            }
            continue;
        }
        last_progress = Instant::now();
        for m in &polled.messages {
            let o = m.header.offset;
            if o < skip {
                continue;
            }
            payload_bytes += m.payload.len() as u64;
            if (o - skip).is_multiple_of(per_batch) {
                let micros = arrived.saturating_sub(m.header.origin_timestamp);
                histogram.record(Duration::from_micros(micros));
                shared.batches_done.fetch_add(1, Ordering::Relaxed);
            }
        }
        offset = polled
            .messages
            .last()
            .map_or(offset, |m| m.header.offset + 1);
    }
    Ok(ActorOutcome {
        index,
        role: Role::Consumer,
        target,
        messages: offset - skip,
        payload_bytes,
        histogram,
        started,
        finished: Instant::now(),
    })
}
