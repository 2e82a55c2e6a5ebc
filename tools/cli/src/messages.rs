//! `produce` (one message per input line, sent in batches) and `consume`
//! (one line per message on stdout: by offset from one partition, after a
//! consumer's stored offset, or as a member of a consumer group).

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use iggy::prelude::*;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::{CliError, ConsumeArgs, ProduceArgs, failed, identifier};

/// How long `--follow` waits after an empty poll before the next one.
const FOLLOW_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// The most messages one poll asks for.
const POLL_COUNT_MAX: u64 = 1000;

/// `produce`: every line of stdin (or `--file`), without its line ending,
/// becomes one message; empty lines are skipped (a message needs a
/// payload). Prints what it sent on stderr.
pub async fn produce(
    client: &IggyClient,
    addr: SocketAddr,
    args: &ProduceArgs,
) -> Result<(), CliError> {
    let stream = identifier("stream", &args.stream)?;
    let topic = identifier("topic", &args.topic)?;
    let partitioning = match (&args.partition, &args.key) {
        (Some(p), _) => Partitioning::partition_id(*p),
        (None, Some(key)) => Partitioning::messages_key_str(key)
            .map_err(|e| failed(addr, &format!("using key {key:?}"), &e))?,
        (None, None) => Partitioning::balanced(),
    };
    let batch_max = args.batch.max(1);
    let source = match &args.file {
        Some(path) => path.display().to_string(),
        None => "stdin".to_owned(),
    };
    let input: Box<dyn tokio::io::AsyncRead + Unpin + Send> = match &args.file {
        Some(path) => Box::new(
            tokio::fs::File::open(path)
                .await
                .map_err(|e| CliError(format!("could not open {}: {e}", path.display())))?,
        ),
        None => Box::new(tokio::io::stdin()),
    };
    let mut lines = BufReader::new(input).lines();
    let where_to = format!("stream {:?} topic {:?}", args.stream, args.topic);
    let (mut sent, mut skipped) = (0u64, 0u64);
    let mut batch: Vec<IggyMessage> = Vec::with_capacity(batch_max);
    loop {
        let line = lines
            .next_line()
            .await
            .map_err(|e| CliError(format!("reading {source} after {sent} messages: {e}")))?;
        let done = line.is_none();
        if let Some(line) = line {
            if line.is_empty() {
                skipped += 1;
            } else {
                let m = IggyMessage::builder()
                    .payload(bytes::Bytes::from(line.into_bytes()))
                    .build()
                    .map_err(|e| {
                        failed(
                            addr,
                            &format!(
                                "building message {} for {where_to}",
                                sent + batch.len() as u64
                            ),
                            &e,
                        )
                    })?;
                batch.push(m);
            }
        }
        if !batch.is_empty() && (done || batch.len() >= batch_max) {
            client
                .send_messages(&stream, &topic, &partitioning, &mut batch)
                .await
                .map_err(|e| {
                    failed(
                        addr,
                        &format!(
                            "sending {} messages to {where_to} (after {sent} sent)",
                            batch.len()
                        ),
                        &e,
                    )
                })?;
            sent += batch.len() as u64;
            batch.clear();
        }
        if done {
            break;
        }
    }
    eprintln!(
        "sent {sent} messages from {source} to {where_to} on {addr}{}",
        if skipped > 0 {
            format!(" ({skipped} empty lines skipped)")
        } else {
            String::new()
        }
    );
    Ok(())
}

/// Where `consume` reads from next.
enum Cursor {
    /// One partition, from an explicit offset, not committing.
    Offset { partition: u32, next: u64 },
    /// One partition, after the consumer's stored offset, committing.
    Stored { partition: u32 },
    /// Wherever the group assigns this member, committing. The SDK polls
    /// the member's partitions in turn, one per poll, so one empty poll
    /// says nothing about the others: the read is at its end only after
    /// `partitions` empty polls in a row (every assigned partition polled
    /// at least once, as a member holds at most all of them).
    Group { partitions: u32 },
}

/// `consume`.
pub async fn consume(
    client: &IggyClient,
    addr: SocketAddr,
    args: &ConsumeArgs,
) -> Result<(), CliError> {
    let stream = identifier("stream", &args.stream)?;
    let topic = identifier("topic", &args.topic)?;
    let where_from = format!("stream {:?} topic {:?}", args.stream, args.topic);
    let (consumer, mut cursor) = match &args.group {
        Some(group) => {
            let group_id = identifier("consumer group", group)?;
            let what = format!("reading {where_from}");
            let partitions = client
                .get_topic(&stream, &topic)
                .await
                .map_err(|e| failed(addr, &what, &e))?
                .ok_or_else(|| CliError(format!("{where_from} does not exist on {addr}")))?
                .partitions_count;
            join_group(client, addr, &stream, &topic, &group_id, group, &where_from).await?;
            (Consumer::group(group_id), Cursor::Group { partitions })
        }
        None => {
            let consumer = Consumer::new(identifier("consumer", &args.consumer)?);
            let cursor = match args.offset {
                Some(next) => Cursor::Offset {
                    partition: args.partition,
                    next,
                },
                None => Cursor::Stored {
                    partition: args.partition,
                },
            };
            (consumer, cursor)
        }
    };
    let mut out = std::io::stdout().lock();
    let (mut printed, mut empty_in_a_row) = (0u64, 0u64);
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let outcome = loop {
        if args.count.is_some_and(|c| printed >= c) {
            break Ok(());
        }
        let want =
            args.count
                .map_or(POLL_COUNT_MAX, |c| (c - printed).min(POLL_COUNT_MAX)) as u32;
        let (partition, strategy, commit) = match &cursor {
            Cursor::Offset { partition, next } => {
                (Some(*partition), PollingStrategy::offset(*next), false)
            }
            Cursor::Stored { partition } => (Some(*partition), PollingStrategy::next(), true),
            Cursor::Group { .. } => (None, PollingStrategy::next(), true),
        };
        let polled = tokio::select! {
            polled = client.poll_messages(&stream, &topic, partition, &consumer, &strategy, want, commit) => polled,
            _ = &mut interrupted => break Ok(()),
        };
        let polled = match polled {
            Ok(p) => p,
            Err(e) => {
                let at = match partition {
                    Some(p) => format!("partition {p} of {where_from}"),
                    None => format!(
                        "{where_from} as group {:?}",
                        args.group.as_deref().unwrap_or("")
                    ),
                };
                break Err(failed(addr, &format!("polling {at}"), &e));
            }
        };
        if polled.messages.is_empty() {
            empty_in_a_row += 1;
            let drained = match &cursor {
                Cursor::Group { partitions } => empty_in_a_row >= u64::from(*partitions).max(1),
                _ => true,
            };
            if drained && !args.follow {
                break Ok(());
            }
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_POLL_INTERVAL) => continue,
                _ = &mut interrupted => break Ok(()),
            }
        }
        empty_in_a_row = 0;
        for m in &polled.messages {
            if args.count.is_some_and(|c| printed >= c) {
                break;
            }
            let written = if args.show_offsets {
                write!(out, "{} {}\t", polled.partition_id, m.header.offset)
            } else {
                Ok(())
            }
            .and_then(|()| out.write_all(&m.payload))
            .and_then(|()| out.write_all(b"\n"));
            if let Err(e) = written {
                // A closed pipe (`| head`) ends the read quietly.
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(());
                }
                return Err(CliError(format!("writing to stdout: {e}")));
            }
            printed += 1;
        }
        if let (Cursor::Offset { next, .. }, Some(last)) = (&mut cursor, polled.messages.last()) {
            *next = last.header.offset + 1;
        }
        if let Err(e) = out.flush() {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(());
            }
            return Err(CliError(format!("writing to stdout: {e}")));
        }
    };
    if let Cursor::Group { .. } = cursor
        && let Some(group) = &args.group
    {
        let group_id = identifier("consumer group", group)?;
        // Leaving lets the group hand this member's partitions to others at
        // once; a failure here changes nothing that was printed.
        let _ = client
            .leave_consumer_group(&stream, &topic, &group_id)
            .await;
    }
    outcome
}

async fn join_group(
    client: &IggyClient,
    addr: SocketAddr,
    stream: &Identifier,
    topic: &Identifier,
    group_id: &Identifier,
    group: &str,
    where_from: &str,
) -> Result<(), CliError> {
    let what = format!("looking up consumer group {group:?} of {where_from}");
    let found = client
        .get_consumer_group(stream, topic, group_id)
        .await
        .map_err(|e| failed(addr, &what, &e))?;
    if found.is_none() {
        client
            .create_consumer_group(stream, topic, group)
            .await
            .map_err(|e| {
                failed(
                    addr,
                    &format!("creating consumer group {group:?} of {where_from}"),
                    &e,
                )
            })?;
        eprintln!("created consumer group {group} of {where_from}");
    }
    client
        .join_consumer_group(stream, topic, group_id)
        .await
        .map_err(|e| {
            failed(
                addr,
                &format!("joining consumer group {group:?} of {where_from}"),
                &e,
            )
        })
}
