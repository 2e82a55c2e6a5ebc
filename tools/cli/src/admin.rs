//! Streams, topics, consumer offsets and `status`: one SDK call (or a few)
//! per command, printed as plain lines or a table.

use std::net::SocketAddr;

use iggy::prelude::*;

use crate::{CliError, DurabilityArg, OffsetCommand, OffsetTarget, StreamCommand, TopicCommand};
use crate::{failed, identifier};

/// `stream create|list|delete`.
pub async fn stream(
    client: &IggyClient,
    addr: SocketAddr,
    command: &StreamCommand,
) -> Result<(), CliError> {
    match command {
        StreamCommand::Create { name } => {
            let s = client
                .create_stream(name)
                .await
                .map_err(|e| failed(addr, &format!("creating stream {name:?}"), &e))?;
            emitln!("created stream {} (id {})", s.name, s.id);
        }
        StreamCommand::List => {
            let streams = client
                .get_streams()
                .await
                .map_err(|e| failed(addr, "listing the streams", &e))?;
            let mut rows = vec![row(["id", "name", "topics", "messages", "size"])];
            for s in streams {
                rows.push(row([
                    s.id.to_string(),
                    s.name,
                    s.topics_count.to_string(),
                    s.messages_count.to_string(),
                    s.size.as_bytes_u64().to_string(),
                ]));
            }
            emit!("{}", table(&rows));
        }
        StreamCommand::Delete { stream } => {
            let id = identifier("stream", stream)?;
            client
                .delete_stream(&id)
                .await
                .map_err(|e| failed(addr, &format!("deleting stream {stream:?}"), &e))?;
            emitln!("deleted stream {stream}");
        }
    }
    Ok(())
}

/// `topic create|list|delete`.
pub async fn topic(
    client: &IggyClient,
    addr: SocketAddr,
    command: &TopicCommand,
) -> Result<(), CliError> {
    match command {
        TopicCommand::Create {
            stream,
            name,
            partitions,
            durability,
        } => {
            let stream_id = identifier("stream", stream)?;
            let options = TopicCreateOptions {
                partitions_count: Some(*partitions),
                durability: match durability {
                    DurabilityArg::Replicated => Durability::Replicated,
                    DurabilityArg::Persisted => Durability::Persisted,
                },
                ..TopicCreateOptions::default()
            };
            let t = client
                .create_topic(&stream_id, name, &options)
                .await
                .map_err(|e| {
                    failed(
                        addr,
                        &format!("creating topic {name:?} with {partitions} partitions in stream {stream:?}"),
                        &e,
                    )
                })?;
            emitln!(
                "created topic {} (id {}) in stream {stream} with {} partitions",
                t.name,
                t.id,
                t.partitions_count
            );
        }
        TopicCommand::List { stream } => {
            let stream_id = identifier("stream", stream)?;
            let topics = client.get_topics(&stream_id).await.map_err(|e| {
                failed(
                    addr,
                    &format!("listing the topics of stream {stream:?}"),
                    &e,
                )
            })?;
            let mut rows = vec![row(["id", "name", "partitions", "messages", "size"])];
            for t in topics {
                rows.push(row([
                    t.id.to_string(),
                    t.name,
                    t.partitions_count.to_string(),
                    t.messages_count.to_string(),
                    t.size.as_bytes_u64().to_string(),
                ]));
            }
            emit!("{}", table(&rows));
        }
        TopicCommand::Delete { stream, topic } => {
            let stream_id = identifier("stream", stream)?;
            let topic_id = identifier("topic", topic)?;
            client
                .delete_topic(&stream_id, &topic_id)
                .await
                .map_err(|e| {
                    failed(
                        addr,
                        &format!("deleting topic {topic:?} of stream {stream:?}"),
                        &e,
                    )
                })?;
            emitln!("deleted topic {topic} of stream {stream}");
        }
    }
    Ok(())
}

fn consumer_of(target: &OffsetTarget) -> Result<Consumer, CliError> {
    let id = identifier("consumer", &target.consumer)?;
    Ok(if target.group {
        Consumer::group(id)
    } else {
        Consumer::new(id)
    })
}

fn describe(target: &OffsetTarget) -> String {
    format!(
        "{} {:?} on stream {:?} topic {:?} partition {}",
        if target.group {
            "consumer group"
        } else {
            "consumer"
        },
        target.consumer,
        target.stream,
        target.topic,
        target.partition
    )
}

/// `offset get|set`.
pub async fn offset(
    client: &IggyClient,
    addr: SocketAddr,
    command: &OffsetCommand,
) -> Result<(), CliError> {
    match command {
        OffsetCommand::Get(target) => {
            let info = client
                .get_consumer_offset(
                    &consumer_of(target)?,
                    &identifier("stream", &target.stream)?,
                    &identifier("topic", &target.topic)?,
                    Some(target.partition),
                )
                .await
                .map_err(|e| {
                    failed(
                        addr,
                        &format!("reading the offset of {}", describe(target)),
                        &e,
                    )
                })?;
            match info {
                Some(info) => emitln!(
                    "stored offset {} (partition {}, current offset {})",
                    info.stored_offset,
                    info.partition_id,
                    info.current_offset
                ),
                None => {
                    return Err(CliError(format!(
                        "{} has no stored offset on {addr}",
                        describe(target)
                    )));
                }
            }
        }
        OffsetCommand::Set { target, offset } => {
            client
                .store_consumer_offset(
                    &consumer_of(target)?,
                    &identifier("stream", &target.stream)?,
                    &identifier("topic", &target.topic)?,
                    Some(target.partition),
                    *offset,
                )
                .await
                .map_err(|e| {
                    failed(
                        addr,
                        &format!("storing offset {offset} for {}", describe(target)),
                        &e,
                    )
                })?;
            emitln!("stored offset {offset} for {}", describe(target));
        }
    }
    Ok(())
}

/// `status`: what the Iggy protocol exposes — the cluster's nodes, and for
/// every stream, topic and partition its messages, bytes, current offset
/// and segments, with each topic's consumer groups.
pub async fn status(client: &IggyClient, addr: SocketAddr) -> Result<(), CliError> {
    let cluster = client
        .get_cluster_metadata()
        .await
        .map_err(|e| failed(addr, "reading the cluster metadata", &e))?;
    let n = cluster.nodes.len();
    emitln!(
        "cluster {} at {addr}: {n} {}",
        cluster.name,
        if n == 1 { "node" } else { "nodes" }
    );
    let mut rows = vec![row(["node", "address", "tcp", "role", "status"])];
    for n in &cluster.nodes {
        rows.push(row([
            n.name.clone(),
            n.ip.clone(),
            n.endpoints.tcp.to_string(),
            n.role.to_string(),
            n.status.to_string(),
        ]));
    }
    emit!("{}", table(&rows));

    let streams = client
        .get_streams()
        .await
        .map_err(|e| failed(addr, "listing the streams", &e))?;
    emitln!();
    if streams.is_empty() {
        emitln!("no streams");
        return Ok(());
    }
    let mut rows = vec![row([
        "stream",
        "topic",
        "partition",
        "messages",
        "size",
        "current offset",
        "segments",
    ])];
    let mut groups = vec![row([
        "stream",
        "topic",
        "consumer group",
        "members",
        "partitions",
    ])];
    for s in &streams {
        let stream_id =
            Identifier::numeric(s.id).map_err(|e| failed(addr, "naming a stream", &e))?;
        let topics = client.get_topics(&stream_id).await.map_err(|e| {
            failed(
                addr,
                &format!("listing the topics of stream {:?}", s.name),
                &e,
            )
        })?;
        if topics.is_empty() {
            rows.push(row([
                s.name.clone(),
                "-".into(),
                "-".into(),
                "0".into(),
                "0".into(),
                "-".into(),
                "-".into(),
            ]));
        }
        for t in &topics {
            let topic_id =
                Identifier::numeric(t.id).map_err(|e| failed(addr, "naming a topic", &e))?;
            let what = format!("reading topic {:?} of stream {:?}", t.name, s.name);
            let details = client
                .get_topic(&stream_id, &topic_id)
                .await
                .map_err(|e| failed(addr, &what, &e))?
                .ok_or_else(|| CliError(format!("{what} on {addr}: it was deleted meanwhile")))?;
            for p in &details.partitions {
                rows.push(row([
                    s.name.clone(),
                    t.name.clone(),
                    p.id.to_string(),
                    p.messages_count.to_string(),
                    p.size.as_bytes_u64().to_string(),
                    p.current_offset.to_string(),
                    p.segments_count.to_string(),
                ]));
            }
            let topic_groups = client
                .get_consumer_groups(&stream_id, &topic_id)
                .await
                .map_err(|e| {
                    failed(
                        addr,
                        &format!(
                            "listing the consumer groups of topic {:?} of stream {:?}",
                            t.name, s.name
                        ),
                        &e,
                    )
                })?;
            for g in topic_groups {
                groups.push(row([
                    s.name.clone(),
                    t.name.clone(),
                    g.name,
                    g.members_count.to_string(),
                    g.partitions_count.to_string(),
                ]));
            }
        }
    }
    emit!("{}", table(&rows));
    if groups.len() > 1 {
        emitln!();
        emit!("{}", table(&groups));
    }
    Ok(())
}

fn row<const N: usize, S: Into<String>>(cells: [S; N]) -> Vec<String> {
    cells.into_iter().map(Into::into).collect()
}

/// Left-aligned columns, two spaces apart.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_rows_of_uneven_width_when_tabled_should_align_columns() {
        let t = table(&[row(["a", "bb"]), row(["ccc", "d"])]);
        assert_eq!(t, "a    bb\nccc  d\n");
    }
}
