//! Reading a replica's Prometheus endpoint (docs/operations.md,
//! "Metrics"): one `GET /metrics` over a fresh loopback connection, and
//! the few series the cluster runs watch — a partition's group, its
//! commit point and size, who is its primary and in which view, whether
//! state transfer was used, how many syncs a shard issued.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::ClusterError;

/// A scrape may take this long (the endpoint waits up to 2 s for shards).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// A scrape larger than this is not a replica's answer.
const SCRAPE_SIZE_MAX_BYTES: u64 = 64 << 20;

/// A sample's labels, in the order written.
type Labels = Vec<(String, String)>;

/// One scrape: every sample, by series name, with its labels.
#[derive(Debug, Default)]
pub struct Scrape {
    samples: BTreeMap<String, Vec<(Labels, f64)>>,
}

/// Where a partition's group stands on one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GroupState {
    /// `replog_group_status`: 0 normal.
    pub status: u64,
    /// `replog_group_primary`: whether this replica is its primary.
    pub primary: bool,
    /// `replog_group_commit_min`: the highest op applied here.
    pub commit_min: u64,
    /// `replog_group_commit_max`: the highest op known committed.
    pub commit_max: u64,
    /// `replog_partition_size_bytes`.
    pub size_bytes: u64,
    /// `replog_partition_messages`.
    pub messages: u64,
    /// `replog_partition_segments`.
    pub segments: u64,
}

impl Scrape {
    /// Parses the OpenMetrics text: `name{label="v",…} value` lines;
    /// comments and malformed lines are skipped.
    pub fn parse(text: &str) -> Self {
        let mut samples: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
                None => (series, Vec::new()),
            };
            samples
                .entry(name.to_owned())
                .or_default()
                .push((labels, value));
        }
        Self { samples }
    }

    /// The value of `name` whose labels include every pair of `want`.
    pub fn value(&self, name: &str, want: &[(&str, &str)]) -> Option<f64> {
        self.samples.get(name)?.iter().find_map(|(labels, v)| {
            want.iter()
                .all(|(k, w)| labels.iter().any(|(lk, lv)| lk == k && lv == w))
                .then_some(*v)
        })
    }

    /// The sum of every sample of `name` (a per-shard counter, summed).
    pub fn sum(&self, name: &str) -> f64 {
        self.samples
            .get(name)
            .map_or(0.0, |v| v.iter().map(|(_, x)| x).sum())
    }

    /// The group id of partition `partition` of topic `topic` of stream
    /// `stream` (numeric ids), if the replica holds it.
    pub fn partition_group(&self, stream: u32, topic: u32, partition: u32) -> Option<String> {
        let (s, t, p) = (stream.to_string(), topic.to_string(), partition.to_string());
        self.samples
            .get("replog_partition_size_bytes")?
            .iter()
            .find_map(|(labels, _)| {
                let has = |k: &str, w: &str| labels.iter().any(|(lk, lv)| lk == k && lv == w);
                if has("stream", &s) && has("topic", &t) && has("partition", &p) {
                    labels
                        .iter()
                        .find(|(k, _)| k == "group")
                        .map(|(_, g)| g.clone())
                } else {
                    None
                }
            })
    }

    /// Every partition of topic `topic` of stream `stream` this replica
    /// holds: partition id → group id.
    pub fn partition_groups(&self, stream: u32, topic: u32) -> BTreeMap<u32, String> {
        let (s, t) = (stream.to_string(), topic.to_string());
        let Some(samples) = self.samples.get("replog_partition_size_bytes") else {
            return BTreeMap::new();
        };
        samples
            .iter()
            .filter_map(|(labels, _)| {
                let get = |k: &str| labels.iter().find(|(lk, _)| lk == k).map(|(_, v)| v);
                if get("stream")? != &s || get("topic")? != &t {
                    return None;
                }
                let partition = get("partition")?.parse().ok()?;
                Some((partition, get("group")?.clone()))
            })
            .collect()
    }

    /// Every sample of a per-group series (`replog_group_*`): group id →
    /// value.
    pub fn per_group(&self, name: &str) -> BTreeMap<String, f64> {
        self.samples
            .get(name)
            .map_or_else(BTreeMap::new, |samples| {
                samples
                    .iter()
                    .filter_map(|(labels, v)| {
                        let (_, group) = labels.iter().find(|(k, _)| k == "group")?;
                        Some((group.clone(), *v))
                    })
                    .collect()
            })
    }

    /// The state of `group` here, if every series of it is present.
    pub fn group_state(&self, group: &str) -> Option<GroupState> {
        let g = [("group", group)];
        let get = |name: &str| self.value(name, &g).map(|v| v as u64);
        Some(GroupState {
            status: get("replog_group_status")?,
            primary: get("replog_group_primary")? == 1,
            commit_min: get("replog_group_commit_min")?,
            commit_max: get("replog_group_commit_max")?,
            size_bytes: get("replog_partition_size_bytes")?,
            messages: get("replog_partition_messages")?,
            segments: get("replog_partition_segments")?,
        })
    }
}

/// `a="x",b="y"` (values without escaped quotes, as replog writes them).
fn parse_labels(text: &str) -> Labels {
    text.split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.trim().to_owned(), v.trim().trim_matches('"').to_owned()))
        })
        .collect()
}

/// One `GET /metrics` from `addr`.
pub async fn scrape(addr: SocketAddr) -> Result<Scrape, ClusterError> {
    let fail = |detail: String| ClusterError::Metrics { addr, detail };
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| fail(format!("connect: {e}")))?;
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: replog\r\nConnection: close\r\n\r\n")
            .await
            .map_err(|e| fail(format!("request: {e}")))?;
        let mut answer = Vec::new();
        (&mut stream)
            .take(SCRAPE_SIZE_MAX_BYTES)
            .read_to_end(&mut answer)
            .await
            .map_err(|e| fail(format!("reading the answer: {e}")))?;
        Ok::<_, ClusterError>(answer)
    };
    let answer = tokio::time::timeout(SCRAPE_TIMEOUT, fetch)
        .await
        .map_err(|_| fail(format!("no answer within {SCRAPE_TIMEOUT:?}")))??;
    let text = String::from_utf8_lossy(&answer);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return Err(fail("an answer without an HTTP head".into()));
    };
    if !head.starts_with("HTTP/1.1 200") {
        let status = head.lines().next().unwrap_or_default();
        return Err(fail(format!("answered {status:?}")));
    }
    Ok(Scrape::parse(body))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# TYPE replog_group_op gauge
replog_group_status{group="9223372036854775808"} 0
replog_group_status{group="1"} 0
replog_group_primary{group="1"} 1
replog_group_commit_min{group="1"} 51
replog_group_commit_max{group="1"} 51
replog_partition_messages{group="1",stream="0",topic="0",partition="0"} 5000
replog_partition_size_bytes{group="1",stream="0",topic="0",partition="0"} 5252800
replog_partition_segments{group="1",stream="0",topic="0",partition="0"} 1
replog_transfer_installs_total{shard="0"} 1
replog_transfer_installs_total{shard="1"} 2
garbage line
"#;

    #[test]
    fn given_a_scrape_when_a_partition_is_looked_up_should_give_its_group_and_state() {
        let s = Scrape::parse(TEXT);
        assert_eq!(s.partition_group(0, 0, 0).as_deref(), Some("1"));
        assert_eq!(s.partition_group(0, 0, 1), None);
        assert_eq!(
            s.partition_groups(0, 0).into_iter().collect::<Vec<_>>(),
            vec![(0, "1".to_owned())]
        );
        assert!(s.partition_groups(0, 1).is_empty());
        assert_eq!(
            s.per_group("replog_group_primary")
                .into_iter()
                .collect::<Vec<_>>(),
            vec![("1".to_owned(), 1.0)]
        );
        let g = s.group_state("1").unwrap();
        assert_eq!(
            g,
            GroupState {
                status: 0,
                primary: true,
                commit_min: 51,
                commit_max: 51,
                size_bytes: 5_252_800,
                messages: 5000,
                segments: 1,
            }
        );
        assert_eq!(s.group_state("2"), None);
        assert!((s.sum("replog_transfer_installs_total") - 3.0).abs() < 1e-9);
    }
}
