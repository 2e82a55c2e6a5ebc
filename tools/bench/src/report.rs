//! The report: totals over the measured phase, the latency distribution
//! of every batch of every actor (one merged histogram), and each actor's
//! own figures; printed as text and, with `--json`, written as JSON.

use serde::Serialize;

use crate::actors::{ActorOutcome, Role};
use crate::baseline::ReceiverReport;
use crate::histogram::{LatencyHistogram, Percentiles};
use crate::plan::Plan;

/// One run's figures.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The run as planned.
    pub plan: Plan,
    /// What the latency samples measure.
    pub latency_of: &'static str,
    /// Totals over the measured phase.
    pub totals: Totals,
    /// Every latency sample of every measured actor, merged.
    pub latency: Option<Percentiles>,
    /// Per actor.
    pub actors: Vec<ActorReport>,
    /// What the baseline receiver stored (`baseline` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receiver: Option<ReceiverReport>,
}

/// Totals over the measured phase.
#[derive(Debug, Serialize)]
pub struct Totals {
    /// Messages the plan calls for (actors × batches × messages per batch).
    pub messages_expected: u64,
    /// Messages the measured actors counted: acknowledged sends in the
    /// producer modes, messages received in the consumer and end-to-end
    /// modes.
    pub messages: u64,
    /// Messages the producers had acknowledged (end-to-end only; equal to
    /// `messages` in the producer modes, 0 in the consumer modes, where
    /// the topics are filled before measuring).
    pub messages_sent: u64,
    /// Payload bytes of `messages`.
    pub payload_bytes: u64,
    /// From the first measured batch to the last, in seconds.
    pub elapsed_seconds: f64,
    /// Payload megabytes (10^6 bytes) per second.
    pub megabytes_per_second: f64,
    /// Messages per second.
    pub messages_per_second: f64,
}

/// One actor's figures.
#[derive(Debug, Serialize)]
pub struct ActorReport {
    /// Its index.
    pub index: u32,
    /// Producer or consumer.
    pub role: Role,
    /// Where it worked.
    pub target: String,
    /// Messages sent or received.
    pub messages: u64,
    /// Their payload bytes.
    pub payload_bytes: u64,
    /// Its own measured phase, in seconds.
    pub elapsed_seconds: f64,
    /// Payload megabytes per second over that phase.
    pub megabytes_per_second: f64,
    /// Its own latency distribution.
    pub latency: Option<Percentiles>,
}

impl Report {
    /// Builds the report from every actor's outcome. The latency comes
    /// from the actors whose batches the mode measures: producers in the
    /// producer modes, consumers otherwise.
    pub fn new(plan: Plan, outcomes: &[ActorOutcome]) -> Self {
        let measured_role = if plan.kind.samples_producers() {
            Role::Producer
        } else {
            Role::Consumer
        };
        let measured: Vec<&ActorOutcome> = outcomes
            .iter()
            .filter(|o| o.role == measured_role)
            .collect();
        let mut merged = LatencyHistogram::new();
        for o in &measured {
            merged.merge(&o.histogram);
        }
        let messages: u64 = measured.iter().map(|o| o.messages).sum();
        let payload_bytes: u64 = measured.iter().map(|o| o.payload_bytes).sum();
        let messages_sent: u64 = outcomes
            .iter()
            .filter(|o| o.role == Role::Producer)
            .map(|o| o.messages)
            .sum();
        let start = outcomes.iter().map(|o| o.started).min();
        let end = outcomes.iter().map(|o| o.finished).max();
        let elapsed_seconds = match (start, end) {
            (Some(s), Some(e)) => e.saturating_duration_since(s).as_secs_f64(),
            _ => 0.0,
        };
        let per_second = |x: u64| {
            if elapsed_seconds > 0.0 {
                x as f64 / elapsed_seconds
            } else {
                0.0
            }
        };
        let totals = Totals {
            messages_expected: plan.messages_expected(),
            messages,
            messages_sent,
            payload_bytes,
            elapsed_seconds,
            megabytes_per_second: per_second(payload_bytes) / 1e6,
            messages_per_second: per_second(messages),
        };
        let actors = outcomes
            .iter()
            .map(|o| {
                let secs = o
                    .finished
                    .saturating_duration_since(o.started)
                    .as_secs_f64();
                ActorReport {
                    index: o.index,
                    role: o.role,
                    target: o.target.to_string(),
                    messages: o.messages,
                    payload_bytes: o.payload_bytes,
                    elapsed_seconds: secs,
                    megabytes_per_second: if secs > 0.0 {
                        o.payload_bytes as f64 / secs / 1e6
                    } else {
                        0.0
                    },
                    latency: o.histogram.percentiles(),
                }
            })
            .collect();
        let latency_of = match plan.kind {
            crate::plan::Kind::EndToEnd => {
                "batch, from its send time (open loop: its scheduled time) to the arrival of its first message at the consumer"
            }
            _ if plan.rate_bytes_per_second.is_some() => {
                "batch (one send or one non-empty poll), from its scheduled time to the reply"
            }
            _ => "batch (one send or one non-empty poll), from the request to the reply",
        };
        let latency = merged.percentiles();
        if let Some(l) = &latency {
            debug_assert!(l.ordered().windows(2).all(|w| w[0] <= w[1]), "{l:?}");
        }
        Self {
            plan,
            latency_of,
            totals,
            latency,
            actors,
            receiver: None,
        }
    }

    /// The report of a baseline run, with what its receiver stored.
    pub fn with_receiver(mut self, receiver: ReceiverReport) -> Self {
        self.receiver = Some(receiver);
        self
    }

    /// The text report.
    pub fn render(&self) -> String {
        let p = &self.plan;
        let t = &self.totals;
        let mut out = String::new();
        let loop_kind = match p.rate_bytes_per_second {
            Some(r) => format!("open loop at {:.2} MB/s", r / 1e6),
            None => "closed loop".to_owned(),
        };
        out.push_str(&format!(
            "replog-bench {} against {}: {} actors, {} streams x {} partitions ({}), {} B x {} messages per batch, {} batches per actor, {}, warm-up {:.1} s\n",
            p.kind.name(),
            p.addr,
            p.actors,
            p.streams,
            p.partitions,
            p.durability.name(),
            p.message_size,
            p.messages_per_batch,
            p.batches_per_actor,
            loop_kind,
            p.warmup.as_secs_f64(),
        ));
        out.push_str(&format!(
            "total: {} of {} messages, {:.3} MB in {:.3} s: {:.2} MB/s, {:.0} msg/s\n",
            t.messages,
            t.messages_expected,
            t.payload_bytes as f64 / 1e6,
            t.elapsed_seconds,
            t.megabytes_per_second,
            t.messages_per_second,
        ));
        match &self.latency {
            Some(l) => out.push_str(&format!(
                "latency (ms) per {}\n  {} samples merged over every actor: p50 {:.3}  p90 {:.3}  p95 {:.3}  p99 {:.3}  p99.9 {:.3}  p99.99 {:.3}  max {:.3}  (min {:.3}, mean {:.3})\n",
                self.latency_of,
                l.samples,
                l.p50_ms,
                l.p90_ms,
                l.p95_ms,
                l.p99_ms,
                l.p999_ms,
                l.p9999_ms,
                l.max_ms,
                l.min_ms,
                l.mean_ms
            )),
            None => out.push_str("latency: no samples\n"),
        }
        if let Some(r) = &self.receiver {
            out.push_str(&format!(
                "baseline receiver: {} frames, {:.3} MB (headers included) appended to {} files under {} from {} connections; page cache, never synced; deleted after the run\n",
                r.frames_appended,
                r.bytes_appended as f64 / 1e6,
                r.files,
                r.dir.display(),
                r.connections
            ));
        }
        for a in &self.actors {
            let lat = a
                .latency
                .as_ref()
                .map(|l| {
                    format!(
                        "p50 {:.3} ms  p99 {:.3} ms  max {:.3} ms",
                        l.p50_ms, l.p99_ms, l.max_ms
                    )
                })
                .unwrap_or_else(|| "no samples".into());
            out.push_str(&format!(
                "  {:?} {:>3} {}: {} messages, {:.2} MB/s, {}\n",
                a.role, a.index, a.target, a.messages, a.megabytes_per_second, lat
            ));
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use clap::Parser;
    use tokio::time::Instant;

    use super::*;
    use crate::actors::Target;
    use crate::args::Cli;

    fn outcome(
        index: u32,
        role: Role,
        latencies_ms: &[u64],
        start: Instant,
        secs: u64,
    ) -> ActorOutcome {
        let mut histogram = LatencyHistogram::new();
        for &ms in latencies_ms {
            histogram.record(Duration::from_millis(ms));
        }
        ActorOutcome {
            index,
            role,
            target: Target {
                stream: "s".into(),
                partition: Some(0),
            },
            messages: 1_000,
            payload_bytes: 1_000_000,
            histogram,
            started: start,
            finished: start + Duration::from_secs(secs),
        }
    }

    #[test]
    fn given_end_to_end_outcomes_when_reported_should_merge_the_consumers_and_count_both_sides() {
        let cli = Cli::try_parse_from([
            "replog-bench",
            "-m",
            "1000",
            "-p",
            "10",
            "-b",
            "100",
            "e2e",
            "--producers",
            "2",
        ])
        .unwrap();
        let plan = Plan::from_cli(&cli).unwrap();
        let t0 = Instant::now();
        // The producers' send latencies must not enter the end-to-end
        // distribution; the two consumers' samples all must.
        let outcomes = [
            outcome(0, Role::Producer, &[1000, 1000], t0, 2),
            outcome(0, Role::Consumer, &[1, 2, 3], t0, 2),
            outcome(1, Role::Producer, &[1000], t0, 4),
            outcome(1, Role::Consumer, &[4, 100], t0 + Duration::from_secs(1), 3),
        ];
        let r = Report::new(plan, &outcomes);
        let l = r.latency.as_ref().unwrap();
        assert_eq!(l.samples, 5);
        assert!((l.max_ms - 100.0).abs() < 0.1, "{l:?}");
        assert_eq!(r.totals.messages, 2_000);
        assert_eq!(r.totals.messages_sent, 2_000);
        assert_eq!(r.totals.messages_expected, 2_000);
        // First start to last finish: t0 .. t0 + 4 s.
        assert!((r.totals.elapsed_seconds - 4.0).abs() < 1e-9);
        assert!((r.totals.megabytes_per_second - 0.5).abs() < 1e-9);
        assert!((r.totals.messages_per_second - 500.0).abs() < 1e-9);
        assert_eq!(r.actors.len(), 4);
        assert!(r.render().contains("5 samples merged over every actor"));
    }
}
