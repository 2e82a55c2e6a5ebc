//! Latency histograms: one per actor while it runs, merged into one for the
//! report. Percentiles of a merged histogram are the percentiles of every
//! sample taken; averaging each actor's percentiles (what iggy-bench does)
//! is not, and hides a slow actor behind fast ones.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The largest latency recorded exactly: one hour. A longer one is clamped
/// to it (and `max` then reads one hour), which no sane run reaches.
const HIGHEST_TRACKABLE_NANOS: u64 = 3_600_000_000_000;

/// Three significant figures: every value is within 0.1% of the sample.
const SIGNIFICANT_FIGURES: u8 = 3;

/// Per-batch latencies of one actor (or, merged, of a whole run), in
/// nanoseconds.
#[derive(Clone)]
pub struct LatencyHistogram {
    inner: Histogram<u64>,
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        // 1 ns .. 1 h at 3 significant figures is valid by construction.
        #[allow(clippy::expect_used)]
        let inner = Histogram::new_with_bounds(1, HIGHEST_TRACKABLE_NANOS, SIGNIFICANT_FIGURES)
            .expect("1 ns .. 1 h at 3 significant figures is a valid histogram");
        Self { inner }
    }

    /// Records one latency (clamped to 1 ns .. 1 h).
    pub fn record(&mut self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.inner
            .saturating_record(nanos.clamp(1, HIGHEST_TRACKABLE_NANOS));
    }

    /// Adds every sample of `other` to this histogram. Both have the same
    /// bounds, so the merge is exact: the result equals the histogram of
    /// the two sample sets recorded into one.
    pub fn merge(&mut self, other: &Self) {
        // Same bounds on both sides: `add` cannot fail.
        #[allow(clippy::expect_used)]
        self.inner
            .add(&other.inner)
            .expect("histograms with equal bounds merge");
    }

    /// How many samples were recorded.
    #[cfg(test)]
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    /// The summary the report prints; `None` when nothing was recorded.
    pub fn percentiles(&self) -> Option<Percentiles> {
        if self.inner.is_empty() {
            return None;
        }
        let ms = |nanos: u64| nanos as f64 / 1e6;
        let at = |q: f64| ms(self.inner.value_at_quantile(q));
        Some(Percentiles {
            samples: self.inner.len(),
            min_ms: ms(self.inner.min()),
            mean_ms: self.inner.mean() / 1e6,
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p95_ms: at(0.95),
            p99_ms: at(0.99),
            p999_ms: at(0.999),
            p9999_ms: at(0.9999),
            max_ms: ms(self.inner.max()),
        })
    }
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

/// A latency distribution, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Percentiles {
    /// Samples behind the figures.
    pub samples: u64,
    /// Smallest.
    pub min_ms: f64,
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// 99.99th percentile.
    pub p9999_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Percentiles {
    /// The figures in order, min to max; each is at least the one before.
    pub fn ordered(&self) -> [f64; 8] {
        [
            self.min_ms,
            self.p50_ms,
            self.p90_ms,
            self.p95_ms,
            self.p99_ms,
            self.p999_ms,
            self.p9999_ms,
            self.max_ms,
        ]
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn micros(values: impl IntoIterator<Item = u64>) -> LatencyHistogram {
        let mut h = LatencyHistogram::new();
        for v in values {
            h.record(Duration::from_micros(v));
        }
        h
    }

    #[test]
    fn given_two_actors_when_merged_should_equal_one_histogram_of_all_samples() {
        let fast: Vec<u64> = (1..=990).collect();
        let slow: Vec<u64> = (0..10).map(|i| 50_000 + i * 1_000).collect();
        let mut merged = micros(fast.iter().copied());
        merged.merge(&micros(slow.iter().copied()));
        let together = micros(fast.iter().chain(slow.iter()).copied());
        assert_eq!(merged.len(), 1_000);
        assert_eq!(merged.percentiles(), together.percentiles());
    }

    #[test]
    fn given_one_slow_actor_when_merged_should_show_its_tail_that_averaging_hides() {
        // Actor A: 1,000 samples of 1 ms. Actor B: 1,000 samples of 1 ms and
        // 20 of 100 ms. Merged, the P99 is still 1 ms (20 of 2,020 is under
        // 1%) but the P99.9 is 100 ms: 2,018 samples lie below it.
        let a = micros(std::iter::repeat_n(1_000, 1_000));
        let b = micros(std::iter::repeat_n(1_000, 1_000).chain(std::iter::repeat_n(100_000, 20)));
        let mut merged = a.clone();
        merged.merge(&b);
        let p = merged.percentiles().unwrap();
        assert_eq!(p.samples, 2_020);
        assert!((p.p99_ms - 1.0).abs() < 0.01, "{p:?}");
        assert!((p.p999_ms - 100.0).abs() < 0.1, "{p:?}");
        // Averaging the actors' P99.9 would report about 50 ms.
        let avg = (a.percentiles().unwrap().p999_ms + b.percentiles().unwrap().p999_ms) / 2.0;
        assert!((avg - 50.5).abs() < 0.1, "{avg}");
    }

    #[test]
    fn given_constructed_samples_when_summarised_should_give_exact_quantiles_within_precision() {
        // 1..=10_000 µs: the q-quantile is q * 10,000 µs.
        let p = micros(1..=10_000).percentiles().unwrap();
        let close = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 1e-9;
        assert!(close(p.p50_ms, 5.0), "{p:?}");
        assert!(close(p.p90_ms, 9.0), "{p:?}");
        assert!(close(p.p99_ms, 9.9), "{p:?}");
        assert!(close(p.p999_ms, 9.99), "{p:?}");
        assert!(close(p.max_ms, 10.0), "{p:?}");
        assert!(close(p.min_ms, 0.001), "{p:?}");
        assert!(p.ordered().windows(2).all(|w| w[0] <= w[1]), "{p:?}");
    }

    #[test]
    fn given_no_samples_when_summarised_should_give_none() {
        assert_eq!(LatencyHistogram::new().percentiles(), None);
    }

    #[test]
    fn given_a_latency_past_one_hour_when_recorded_should_clamp_not_panic() {
        let mut h = LatencyHistogram::new();
        h.record(Duration::from_secs(7_200));
        h.record(Duration::ZERO);
        let p = h.percentiles().unwrap();
        assert_eq!(p.samples, 2);
        assert!(p.max_ms >= 3_599_000.0 && p.max_ms <= 3_604_000.0, "{p:?}");
    }
}
