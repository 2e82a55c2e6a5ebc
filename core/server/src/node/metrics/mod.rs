//! The replica's Prometheus metrics: the instruments the server layer
//! updates as things happen, the shards' snapshots read on each scrape,
//! and the HTTP endpoint that serves both (docs/operations.md lists every
//! series).
//!
//! Two kinds of source, so that no hot path takes a lock shared across
//! cores:
//! - **Instruments** ([`Metrics`]): prometheus-client counters, gauges and
//!   histograms updated where the event happens in the server layer — a
//!   client request's latency in the listener (shard 0's thread), an fsync
//!   on the shard that issued it (one histogram per shard, so each shard
//!   locks only its own), a bus lane going up or down. Latency is measured
//!   here with the wall clock, never inside shard logic, which stays
//!   deterministic.
//! - **Snapshots** ([`shard::ShardSnapshot`]): per-group and per-partition
//!   state that the shard already holds (view, commit, offsets, sizes,
//!   transfer progress). A scrape asks every shard for one through its
//!   inbox and renders them ([`scrape`]); between scrapes they cost
//!   nothing.

pub mod http;
pub mod scrape;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use shard::SnapshotDetail;

use super::handle::ShardHandles;

/// Where and how a replica serves its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsSetup {
    /// The endpoint's address (port 0 picks a free one).
    pub listen: SocketAddr,
    /// Whether per-partition and per-group series are exposed, or only
    /// per-shard sums.
    pub detail: SnapshotDetail,
}

/// Labels: a shard.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ShardLabel {
    /// The shard index.
    pub shard: u16,
}

/// Labels: a client command.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabel {
    /// `send_messages` or `poll_messages`.
    pub command: &'static str,
}

/// Labels: a bus lane to a peer.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneLabel {
    /// The peer replica.
    pub peer: u8,
    /// `shard` (the consensus lanes, one per shard index) or `forward`.
    pub lane: &'static str,
}

/// Labels: a bus lane and why it went down.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LaneDropLabel {
    /// The peer replica.
    pub peer: u8,
    /// `shard` or `forward`.
    pub lane: &'static str,
    /// Why.
    pub reason: &'static str,
}

/// Labels: a refusal reason.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// Request latency buckets: 100 µs to about 3.3 s, doubling.
fn request_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
}

/// Fsync latency buckets: 25 µs to about 0.8 s, doubling.
fn fsync_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_025, 2.0, 16))
}

/// Client request instruments (updated on shard 0's thread, where the
/// listener runs).
#[derive(Debug, Clone)]
pub struct ClientMetrics {
    produce: Histogram,
    poll: Histogram,
    connections: Gauge,
    connections_total: Counter,
    closed: Family<ReasonLabel, Counter>,
}

impl ClientMetrics {
    /// A client connection refused or closed by a limit, by reason
    /// (`connections_max`, `login_timeout`, `idle_timeout`, `io_timeout`,
    /// `login_failures`, `accept_failed`, `tls_handshake`).
    pub fn closed(&self, reason: &'static str) {
        self.closed.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// How many connections `reason` closed so far.
    pub fn closed_count(&self, reason: &'static str) -> u64 {
        self.closed.get_or_create(&ReasonLabel { reason }).get()
    }

    /// Records a served request of `command` that took `elapsed`, from
    /// its frame's arrival to its reply's encoding.
    pub fn observe(&self, command: crate::protocol::CommandCode, elapsed: Duration) {
        use crate::protocol::CommandCode as C;
        match command {
            C::SendMessages => self.produce.observe(elapsed.as_secs_f64()),
            C::PollMessages => self.poll.observe(elapsed.as_secs_f64()),
            _ => {}
        }
    }

    /// A client connected; the guard counts it until dropped.
    pub fn connected(&self) -> ConnectionGuard {
        self.connections.inc();
        self.connections_total.inc();
        ConnectionGuard(self.connections.clone())
    }
}

/// Counts an open client connection until dropped.
#[derive(Debug)]
pub struct ConnectionGuard(Gauge);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Replica-bus instruments.
#[derive(Debug, Clone, Default)]
pub struct BusMetrics {
    /// Lanes up now, by peer and kind (summed over shard indexes).
    pub lanes_up: Family<LaneLabel, Gauge>,
    /// Lanes that came up (first connections and reconnections).
    pub lane_connects: Family<LaneLabel, Counter>,
    /// Lanes that came up after the same lane had been up before.
    pub lane_reconnects: Family<LaneLabel, Counter>,
    /// Lanes that went down, by reason.
    pub lane_drops: Family<LaneDropLabel, Counter>,
    /// Dials that failed (connect or handshake).
    pub dial_failures: Family<LaneLabel, Counter>,
    /// Inbound connections refused at the handshake, by reason.
    pub refused: Family<ReasonLabel, Counter>,
}

impl BusMetrics {
    /// A lane came up; `again` when it had been up before.
    pub fn lane_up(&self, peer: u8, lane: &'static str, again: bool) {
        let label = LaneLabel { peer, lane };
        self.lanes_up.get_or_create(&label).inc();
        self.lane_connects.get_or_create(&label).inc();
        if again {
            self.lane_reconnects.get_or_create(&label).inc();
        }
    }

    /// A lane went down for `reason`.
    pub fn lane_down(&self, peer: u8, lane: &'static str, reason: &'static str) {
        self.lanes_up.get_or_create(&LaneLabel { peer, lane }).dec();
        self.lane_drops
            .get_or_create(&LaneDropLabel { peer, lane, reason })
            .inc();
    }

    /// An inbound connection was refused for `reason`.
    pub fn connection_refused(&self, reason: &'static str) {
        self.refused.get_or_create(&ReasonLabel { reason }).inc();
    }

    /// A dial to `peer` failed.
    pub fn dial_failed(&self, peer: u8, lane: &'static str) {
        self.dial_failures
            .get_or_create(&LaneLabel { peer, lane })
            .inc();
    }
}

/// The instruments of one replica, and the registry that exposes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    client: ClientMetrics,
    bus: Arc<BusMetrics>,
    fsync: HistogramFamily<ShardLabel>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every instrument, registered, at zero.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests: HistogramFamily<CommandLabel> =
            Family::new_with_constructor(request_histogram);
        registry.register(
            "replog_client_request_duration_seconds",
            "Client requests served, from the whole request frame's arrival to its encoded reply",
            requests.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "replog_client_connections_open",
            "Client connections open",
            connections.clone(),
        );
        let connections_total = Counter::default();
        registry.register(
            "replog_client_connections_accepted",
            "Client connections accepted",
            connections_total.clone(),
        );
        let closed: Family<ReasonLabel, Counter> = Family::default();
        registry.register(
            "replog_client_connections_limited",
            "Client connections refused at accept or closed by a limit, by reason",
            closed.clone(),
        );
        // One statement each: a family's read guard lives to the end of
        // its statement, and a second get_or_create in the same one would
        // wait for the write lock behind it for ever.
        let produce = requests
            .get_or_create(&CommandLabel {
                command: "send_messages",
            })
            .clone();
        let poll = requests
            .get_or_create(&CommandLabel {
                command: "poll_messages",
            })
            .clone();
        let client = ClientMetrics {
            produce,
            poll,
            connections,
            connections_total,
            closed,
        };
        let fsync: HistogramFamily<ShardLabel> = Family::new_with_constructor(fsync_histogram);
        registry.register(
            "replog_fsync_duration_seconds",
            "File and directory syncs (fsync, fdatasync) issued by a shard",
            fsync.clone(),
        );
        let bus = BusMetrics::default();
        registry.register(
            "replog_bus_lanes_up",
            "Replica-bus lanes connected now, per peer and kind (shard lanes summed over shard indexes)",
            bus.lanes_up.clone(),
        );
        registry.register(
            "replog_bus_lane_connects",
            "Replica-bus lanes that came up",
            bus.lane_connects.clone(),
        );
        registry.register(
            "replog_bus_lane_reconnects",
            "Replica-bus lanes that came up again after having been up",
            bus.lane_reconnects.clone(),
        );
        registry.register(
            "replog_bus_lane_drops",
            "Replica-bus lanes that went down, by reason",
            bus.lane_drops.clone(),
        );
        registry.register(
            "replog_bus_dial_failures",
            "Replica-bus dials that failed to connect or were refused",
            bus.dial_failures.clone(),
        );
        registry.register(
            "replog_bus_refused_connections",
            "Inbound replica-bus connections refused at the handshake, by reason",
            bus.refused.clone(),
        );
        Self {
            registry,
            client,
            bus: Arc::new(bus),
            fsync,
        }
    }

    /// The client request instruments.
    pub fn client(&self) -> &ClientMetrics {
        &self.client
    }

    /// The bus instruments.
    pub fn bus(&self) -> Arc<BusMetrics> {
        Arc::clone(&self.bus)
    }

    /// Shard `shard`'s fsync histogram (its own: no other core locks it
    /// except a scrape).
    pub fn fsync_histogram(&self, shard: u16) -> Histogram {
        self.fsync.get_or_create(&ShardLabel { shard }).clone()
    }

    /// The whole exposition: the instruments, then every shard's snapshot,
    /// then the end marker.
    pub fn render(&self, handles: &ShardHandles, detail: SnapshotDetail) -> String {
        let mut out = String::with_capacity(16 * 1024);
        let collected = scrape::collect(handles, detail, scrape::SCRAPE_TIMEOUT);
        let encoded = prometheus_client::encoding::text::encode_registry(&mut out, &self.registry)
            .and_then(|()| scrape::encode(&mut out, collected))
            .and_then(|()| prometheus_client::encoding::text::encode_eof(&mut out));
        if let Err(error) = encoded {
            // Writing to a String fails only on a formatting bug.
            tracing::error!(%error, "metrics exposition failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_new_metrics_when_encoded_should_list_every_instrument_once() {
        let metrics = Metrics::new();
        metrics.client().observe(
            crate::protocol::CommandCode::SendMessages,
            Duration::from_millis(3),
        );
        let _open = metrics.client().connected();
        metrics.fsync_histogram(1).observe(0.001);
        metrics.bus().lane_up(2, "shard", false);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &metrics.registry)
            .expect("encodes into a string");
        for line in [
            "replog_client_request_duration_seconds_count{command=\"send_messages\"} 1",
            "replog_client_request_duration_seconds_count{command=\"poll_messages\"} 0",
            "replog_client_connections_open 1",
            "replog_client_connections_accepted_total 1",
            "replog_fsync_duration_seconds_count{shard=\"1\"} 1",
            "replog_bus_lanes_up{peer=\"2\",lane=\"shard\"} 1",
            "replog_bus_lane_connects_total{peer=\"2\",lane=\"shard\"} 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        assert!(out.ends_with("# EOF\n"));
    }
}
