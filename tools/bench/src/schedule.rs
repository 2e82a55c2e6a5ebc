//! The open-loop scheduler: with `--rate`, batch `k` of an actor is due at
//! `start + k * interval`, whatever happened to batch `k - 1`, and its
//! latency is measured from that due time. A stall of the server therefore
//! shows as the latency of every batch that should have gone out during it
//! (no coordinated omission); a closed-loop run, without `--rate`, measures
//! each batch from the moment it was sent.

use std::time::Duration;

// tokio's clock, so a paused test clock drives the schedule too.
use tokio::time::Instant;

/// A byte rate, as `--rate` takes it: `100MB`, `1.5GB`, `500KB`, `4096B`
/// or a bare number of bytes, per second, decimal units (10^6 for MB).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ByteRate {
    /// Bytes per second.
    pub bytes_per_second: f64,
}

impl std::str::FromStr for ByteRate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let trimmed = text.trim();
        let trimmed = trimmed
            .strip_suffix("/s")
            .or_else(|| trimmed.strip_suffix("ps"))
            .unwrap_or(trimmed);
        let split = trimmed
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(trimmed.len());
        let (number, unit) = trimmed.split_at(split);
        let number: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a byte rate such as 100MB or 1GB"))?;
        let scale = match unit.trim().to_ascii_uppercase().as_str() {
            "" | "B" => 1.0,
            "KB" => 1e3,
            "MB" => 1e6,
            "GB" => 1e9,
            "KIB" => 1024.0,
            "MIB" => 1024.0 * 1024.0,
            "GIB" => 1024.0 * 1024.0 * 1024.0,
            other => {
                return Err(format!(
                    "{text:?}: unknown unit {other:?} (use B, KB, MB, GB, KiB, MiB or GiB)"
                ));
            }
        };
        let bytes_per_second = number * scale;
        if !(bytes_per_second.is_finite() && bytes_per_second >= 1.0) {
            return Err(format!(
                "{text:?}: a rate must be at least 1 byte per second"
            ));
        }
        Ok(Self { bytes_per_second })
    }
}

/// When an actor's batches are due.
#[derive(Debug, Clone, Copy)]
pub enum Schedule {
    /// Each batch goes out as soon as the previous one is answered;
    /// latency is measured from the send.
    ClosedLoop,
    /// Batch `k` is due at `start + k * interval`; latency is measured from
    /// that due time.
    OpenLoop {
        /// When batch 0 is due.
        start: Instant,
        /// Between two due times.
        interval: Duration,
    },
}

impl Schedule {
    /// The schedule of one of `actors` actors that together send
    /// `batch_bytes`-byte batches at `rate` (aggregate), from `start`.
    pub fn for_actor(
        rate: Option<ByteRate>,
        actors: u32,
        batch_bytes: u64,
        start: Instant,
    ) -> Self {
        match rate {
            None => Self::ClosedLoop,
            Some(rate) => {
                let per_actor = rate.bytes_per_second / f64::from(actors.max(1));
                let interval = Duration::from_secs_f64(batch_bytes as f64 / per_actor);
                Self::OpenLoop { start, interval }
            }
        }
    }

    /// When batch `k` is due; `None` for a closed loop (it is due now).
    pub fn due(&self, k: u64) -> Option<Instant> {
        match *self {
            Self::ClosedLoop => None,
            Self::OpenLoop { start, interval } => {
                // u32 covers 4 billion batches; past that, saturate.
                let k = u32::try_from(k).unwrap_or(u32::MAX);
                Some(start + interval.saturating_mul(k))
            }
        }
    }

    /// Waits until batch `k` is due and returns the instant its latency is
    /// measured from: the due time in an open loop (even when already
    /// late: the wait is part of the latency), the send time in a closed one.
    pub async fn wait_for(&self, k: u64) -> Instant {
        match self.due(k) {
            None => Instant::now(),
            Some(due) => {
                if due > Instant::now() {
                    tokio::time::sleep_until(due).await;
                }
                due
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_rates_in_decimal_and_binary_units_when_parsed_should_scale() {
        let bps = |s: &str| s.parse::<ByteRate>().unwrap().bytes_per_second;
        assert_eq!(bps("100MB"), 100e6);
        assert_eq!(bps("1.5GB"), 1.5e9);
        assert_eq!(bps("500kb"), 500e3);
        assert_eq!(bps("4096"), 4096.0);
        assert_eq!(bps("1MiB/s"), 1_048_576.0);
        assert_eq!(bps("2 GB"), 2e9);
    }

    #[test]
    fn given_bad_rates_when_parsed_should_say_why() {
        assert!(
            "fast"
                .parse::<ByteRate>()
                .unwrap_err()
                .contains("byte rate")
        );
        assert!(
            "10XB"
                .parse::<ByteRate>()
                .unwrap_err()
                .contains("unknown unit")
        );
        assert!("0MB".parse::<ByteRate>().unwrap_err().contains("at least"));
    }

    #[test]
    fn given_a_rate_shared_by_actors_when_scheduled_should_space_batches_evenly() {
        let start = Instant::now();
        // 100 MB/s over 4 actors, 1 MB batches: each actor every 40 ms.
        let rate = "100MB".parse().ok();
        let s = Schedule::for_actor(rate, 4, 1_000_000, start);
        assert_eq!(s.due(0), Some(start));
        assert_eq!(s.due(1), Some(start + Duration::from_millis(40)));
        assert_eq!(s.due(25), Some(start + Duration::from_secs(1)));
        assert_eq!(Schedule::for_actor(None, 4, 1, start).due(7), None);
    }

    #[tokio::test(start_paused = true)]
    async fn given_an_open_loop_when_a_send_stalls_should_keep_the_schedule_and_charge_the_wait() {
        let start = Instant::now();
        let s = Schedule::OpenLoop {
            start,
            interval: Duration::from_millis(10),
        };
        // On time: the wait ends at the due time.
        assert_eq!(s.wait_for(0).await, start);
        let due1 = s.wait_for(1).await;
        assert_eq!(due1, start + Duration::from_millis(10));
        assert!(Instant::now() >= due1);
        // A 55 ms stall (the server not answering): batches 2..=6 are late.
        // They are not pushed back: each is still measured from its own due
        // time, so the stall shows in their latencies.
        tokio::time::sleep(Duration::from_millis(55)).await;
        let now = Instant::now();
        for k in 2..=6 {
            let from = s.wait_for(k).await;
            assert_eq!(from, start + Duration::from_millis(10 * k));
            assert!(now.duration_since(from) >= Duration::from_millis(5));
        }
        // Batch 7 is due in the future again: wait for it, do not run ahead.
        let from = s.wait_for(7).await;
        assert_eq!(from, start + Duration::from_millis(70));
        assert!(Instant::now() >= from);
    }

    #[tokio::test]
    async fn given_a_closed_loop_when_waiting_should_measure_from_now() {
        let before = Instant::now();
        let from = Schedule::ClosedLoop.wait_for(1_000).await;
        assert!(from >= before && from <= Instant::now());
    }
}
