//! Streams, topics, consumer offsets and `status`: one SDK call (or a few)
//! per command, printed as plain lines or a table.

use std::net::SocketAddr;

use iggy::prelude::*;

use common::admin::{GroupStatus, REPLOG_STATUS_CODE, ReplicaStatus};
use testkit::connection::Connection;

use crate::{CliError, DurabilityArg, OffsetCommand, OffsetTarget, StreamCommand, TopicCommand};
use crate::{connect_to, failed, identifier};

/// A `--message-expiry` value, as the SDK parses one.
fn expiry_arg(text: Option<&str>) -> Result<Option<IggyExpiry>, CliError> {
    text.map(|t| {
        t.parse()
            .map_err(|e| CliError(format!("--message-expiry {t:?}: {e}")))
    })
    .transpose()
}

/// A `--max-size` value, as the SDK parses one.
fn size_arg(text: Option<&str>) -> Result<Option<MaxTopicSize>, CliError> {
    text.map(|t| {
        t.parse()
            .map_err(|e| CliError(format!("--max-size {t:?}: {e}")))
    })
    .transpose()
}

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
            message_expiry,
            max_size,
        } => {
            let stream_id = identifier("stream", stream)?;
            let options = TopicCreateOptions {
                partitions_count: Some(*partitions),
                durability: match durability {
                    DurabilityArg::Replicated => Durability::Replicated,
                    DurabilityArg::Persisted => Durability::Persisted,
                },
                message_expiry: expiry_arg(message_expiry.as_deref())?,
                max_topic_size: size_arg(max_size.as_deref())?,
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
        TopicCommand::Update {
            stream,
            topic,
            name,
            message_expiry,
            max_size,
        } => {
            let stream_id = identifier("stream", stream)?;
            let topic_id = identifier("topic", topic)?;
            let what = format!("updating topic {topic:?} of stream {stream:?}");
            // The request always carries a name: keep the current one
            // unless a new one is given.
            let current = client
                .get_topic(&stream_id, &topic_id)
                .await
                .map_err(|e| failed(addr, &what, &e))?
                .ok_or_else(|| {
                    CliError(format!(
                        "topic {topic:?} of stream {stream:?} does not exist"
                    ))
                })?;
            let name = name.clone().unwrap_or(current.name);
            let options = TopicUpdateOptions {
                message_expiry: expiry_arg(message_expiry.as_deref())?,
                max_topic_size: size_arg(max_size.as_deref())?,
                ..TopicUpdateOptions::default()
            };
            client
                .update_topic(&stream_id, &topic_id, &name, &options)
                .await
                .map_err(|e| failed(addr, &what, &e))?;
            emitln!("updated topic {name} of stream {stream}");
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
            let mut rows = vec![row([
                "id",
                "name",
                "partitions",
                "messages",
                "size",
                "expiry",
                "max size",
            ])];
            for t in topics {
                rows.push(row([
                    t.id.to_string(),
                    t.name,
                    t.partitions_count.to_string(),
                    t.messages_count.to_string(),
                    t.size.as_bytes_u64().to_string(),
                    t.message_expiry.to_string(),
                    t.max_topic_size.to_string(),
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
///
/// Against replog it then lists, for every replica of the roster and every
/// consensus group, the view, role, commit, lag, transfer progress and
/// fencing (replog's `REPLOG_STATUS` admin command, docs/formats.md §17).
pub async fn status(client: &IggyClient, connection: &Connection) -> Result<(), CliError> {
    let addr = connection.addr;
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
    replica_groups(client, connection).await?;

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

/// How long `status` waits for one other replica (connect, log in, answer).
const PEER_STATUS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// What one replica answered.
struct Answer {
    id: u8,
    address: String,
    status: Result<ReplicaStatus, String>,
}

/// The per-replica and per-group tables: `REPLOG_STATUS` on the connected
/// replica, then on every other replica of the roster it reports. A server
/// that does not know the command gets one line saying so.
async fn replica_groups(client: &IggyClient, connection: &Connection) -> Result<(), CliError> {
    let addr = connection.addr;
    let here = match fetch_status(client, addr).await {
        Ok(Some(status)) => status,
        Ok(None) => {
            emitln!();
            emitln!(
                "no per-group status: {addr} does not know REPLOG_STATUS (not a replog server)"
            );
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let mut answers = Vec::new();
    for r in &here.roster {
        if r.id == here.replica {
            continue;
        }
        let status = match r.client_address.parse::<SocketAddr>() {
            Ok(peer) => {
                let asked = async {
                    let c = connect_to(peer, &connection.username, &connection.password).await?;
                    fetch_status(&c, peer).await
                };
                match tokio::time::timeout(PEER_STATUS_TIMEOUT, asked).await {
                    Ok(Ok(Some(status))) => Ok(status),
                    Ok(Ok(None)) => Err("does not know REPLOG_STATUS".to_owned()),
                    Ok(Err(e)) => Err(e.0),
                    Err(_) => Err(format!(
                        "no answer within {} s",
                        PEER_STATUS_TIMEOUT.as_secs()
                    )),
                }
            }
            Err(_) => Err(format!("its address {:?} does not parse", r.client_address)),
        };
        answers.push(Answer {
            id: r.id,
            address: r.client_address.clone(),
            status,
        });
    }
    answers.push(Answer {
        id: here.replica,
        address: addr.to_string(),
        status: Ok(here),
    });
    answers.sort_by_key(|a| a.id);
    emitln!();
    emit!("{}", render_replicas(&answers));
    emitln!();
    emit!("{}", render_groups(&answers));
    Ok(())
}

/// `Ok(None)`: the server answered InvalidCommand (it has no such command).
async fn fetch_status(
    client: &IggyClient,
    addr: SocketAddr,
) -> Result<Option<ReplicaStatus>, CliError> {
    match client
        .send_binary_request(REPLOG_STATUS_CODE, bytes::Bytes::new())
        .await
    {
        Ok(body) => ReplicaStatus::decode(&body)
            .map(Some)
            .map_err(|e| CliError(format!("the status from {addr} is malformed: {e}"))),
        Err(IggyError::InvalidCommand) => Ok(None),
        Err(e) => Err(failed(addr, "asking for the replica status", &e)),
    }
}

fn render_replicas(answers: &[Answer]) -> String {
    let mut rows = vec![row(["replica", "address", "shards", "groups", "answer"])];
    for a in answers {
        match &a.status {
            Ok(s) => {
                let shards = if s.shards_answered == s.shards {
                    s.shards.to_string()
                } else {
                    format!("{} of {} answered", s.shards_answered, s.shards)
                };
                rows.push(row([
                    a.id.to_string(),
                    a.address.clone(),
                    shards,
                    s.groups.len().to_string(),
                    "ok".to_owned(),
                ]));
            }
            Err(e) => rows.push(row([
                a.id.to_string(),
                a.address.clone(),
                "-".to_owned(),
                "-".to_owned(),
                e.clone(),
            ])),
        }
    }
    table(&rows)
}

/// The per-group table's header.
const GROUP_COLUMNS: [&str; 11] = [
    "group",
    "partition",
    "replica",
    "role",
    "status",
    "view",
    "op",
    "commit",
    "lag",
    "messages",
    "note",
];

/// One row per group and replica, by group id then replica id.
fn render_groups(answers: &[Answer]) -> String {
    let mut entries: Vec<(u8, &GroupStatus)> = answers
        .iter()
        .filter_map(|a| Some((a.id, a.status.as_ref().ok()?)))
        .flat_map(|(id, s)| s.groups.iter().map(move |g| (id, g)))
        .collect();
    entries.sort_by_key(|&(id, g)| (!g.is_metadata(), g.group, id));
    let mut rows = vec![row(GROUP_COLUMNS)];
    for (id, g) in entries {
        let (partition, messages) = match (g.is_metadata(), g.partition) {
            (true, _) => ("-".to_owned(), "-".to_owned()),
            (false, Some(p)) => (
                format!("{}/{}/{}", p.stream, p.topic, p.partition),
                p.messages.to_string(),
            ),
            (false, None) => ("(unnamed)".to_owned(), "-".to_owned()),
        };
        rows.push(row([
            if g.is_metadata() {
                // Its id (2^63) says less to an operator than its name.
                "metadata".to_owned()
            } else {
                g.group.to_string()
            },
            partition,
            id.to_string(),
            if g.primary_here {
                "primary".to_owned()
            } else {
                format!("backup of {}", g.primary)
            },
            g.state.word().to_owned(),
            g.view.to_string(),
            g.op.to_string(),
            g.commit_min.to_string(),
            g.lag().to_string(),
            messages,
            note(g),
        ]));
    }
    table(&rows)
}

/// Fencing and a running transfer, in words.
fn note(g: &GroupStatus) -> String {
    let mut parts = Vec::new();
    if g.partition.is_some_and(|p| p.fenced) {
        parts.push("fenced".to_owned());
    }
    if let Some(t) = g.transfer {
        parts.push(
            match t
                .received_bytes
                .saturating_mul(100)
                .checked_div(t.expected_bytes)
            {
                None => format!("transfer from replica {}: starting", t.peer),
                Some(percent) => format!(
                    "transfer from replica {}: {} of {} bytes ({percent}%)",
                    t.peer, t.received_bytes, t.expected_bytes
                ),
            },
        );
    }
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join("; ")
    }
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

    use common::admin::{GroupState, PartitionStatus, TransferStatus};

    const META: u64 = common::METADATA_GROUP.0;

    fn group(group: u64, primary_here: bool) -> GroupStatus {
        GroupStatus {
            group,
            shard: 0,
            state: GroupState::Normal,
            view: 4,
            primary: 1,
            primary_here,
            op: 12,
            commit_min: 10,
            commit_max: 12,
            partition: (!common::GroupId(group).is_metadata()).then_some(PartitionStatus {
                stream: 0,
                topic: 1,
                partition: 2,
                messages: 30,
                size_bytes: 4096,
                next_offset: 30,
                fenced: false,
            }),
            transfer: None,
        }
    }

    fn replica(id: u8, groups: Vec<GroupStatus>) -> Answer {
        Answer {
            id,
            address: format!("127.0.0.1:{}", 8090 + u16::from(id) * 2),
            status: Ok(ReplicaStatus {
                replica: id,
                roster: Vec::new(),
                shards: 2,
                shards_answered: 2,
                groups,
            }),
        }
    }

    #[test]
    fn given_answers_of_three_replicas_when_rendered_should_list_each_group_per_replica() {
        let mut fenced = group(9, false);
        fenced.partition.as_mut().unwrap().fenced = true;
        fenced.state = GroupState::Recovering;
        fenced.transfer = Some(TransferStatus {
            peer: 1,
            received_bytes: 256,
            expected_bytes: 1024,
        });
        let answers = [
            replica(0, vec![group(META, false), fenced]),
            replica(1, vec![group(9, true), group(META, true)]),
            Answer {
                id: 2,
                address: "127.0.0.1:8094".into(),
                status: Err("no answer within 5 s".into()),
            },
        ];
        let replicas = render_replicas(&answers);
        let lines: Vec<&str> = replicas.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>()[..5],
            ["0", "127.0.0.1:8090", "2", "2", "ok"]
        );
        assert!(lines[3].ends_with("no answer within 5 s"), "{replicas}");

        let groups = render_groups(&answers);
        let rows: Vec<&str> = groups.lines().collect();
        assert_eq!(rows.len(), 5, "{groups}");
        let cells_of = |r: &str| r.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let cells = |i: usize| cells_of(rows[i]);
        assert_eq!(cells_of(rows[0]), GROUP_COLUMNS);
        assert_eq!(cells(1)[..5], ["metadata", "-", "0", "backup", "of"]);
        assert_eq!(cells(2)[..4], ["metadata", "-", "1", "primary"]);
        assert_eq!(cells(3)[..3], ["9", "0/1/2", "0"]);
        assert!(
            rows[3].contains("recovering")
                && rows[3].ends_with("fenced; transfer from replica 1: 256 of 1024 bytes (25%)"),
            "{groups}"
        );
        // view, op, commit, lag, messages, note.
        assert_eq!(cells(4)[4..], ["normal", "4", "12", "10", "2", "30", "-"]);
    }

    #[test]
    fn given_a_transfer_before_its_manifest_when_noted_should_say_starting() {
        let mut g = group(3, false);
        g.transfer = Some(TransferStatus {
            peer: 2,
            received_bytes: 0,
            expected_bytes: 0,
        });
        assert_eq!(note(&g), "transfer from replica 2: starting");
        assert_eq!(note(&group(3, false)), "-");
    }

    #[test]
    fn given_rows_of_uneven_width_when_tabled_should_align_columns() {
        let t = table(&[row(["a", "bb"]), row(["ccc", "d"])]);
        assert_eq!(t, "a    bb\nccc  d\n");
    }
}
