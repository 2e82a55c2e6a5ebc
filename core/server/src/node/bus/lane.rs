//! What every dialed lane of the bus runs, written once for the shard
//! lanes ([`super::start_shard_lanes`]) and the forward lanes
//! ([`crate::node::forward::Forwarder::start`]).
//!
//! - [`redial`]: dial, hand the connection to its owner until it ends,
//!   back off, dial again, for ever. A peer that is down must not flood
//!   the log, so only the first failure of a run and every 50th after it
//!   are logged (each lane with its own fields); every failure is counted.
//! - [`write_coalesced`]: a connection's writer task, draining its lane's
//!   bounded queue and coalescing what is queued into one write.

use std::net::SocketAddr;

use compio::buf::{BufResult, IoBuf};
use compio::io::{AsyncWrite, AsyncWriteExt};
use futures::StreamExt;
use futures::channel::mpsc;

use super::auth::ClusterKey;
use super::hello::{Hello, Lane};
use super::{Backoff, DialError, LANE_FORWARD, LANE_SHARD, dial};
use crate::node::metrics::BusMetrics;

/// The most bytes a writer coalesces into one write.
const WRITE_COALESCE_BYTES: usize = 1 << 20;
/// Failures of one run between two logged ones.
const DIAL_FAILURES_PER_LOG: u64 = 50;

/// The metric label of `lane`.
fn label(lane: Lane) -> &'static str {
    match lane {
        Lane::Shard(_) => LANE_SHARD,
        Lane::Forward => LANE_FORWARD,
    }
}

/// Dials `addr` with `hello` for ever (the peer is `hello.to`): each
/// connection made is handed to `connected`, which returns when it ends;
/// between two dials the delay is the next of a [`Backoff`] drawn from
/// `seed`, reset by every connection made.
pub async fn redial(
    addr: SocketAddr,
    hello: Hello,
    key: &ClusterKey,
    seed: u64,
    metrics: &BusMetrics,
    mut connected: impl AsyncFnMut(std::net::TcpStream),
) {
    let mut backoff = Backoff::new(seed);
    let mut failures: u64 = 0;
    loop {
        match dial(addr, hello, key.clone()).await {
            Ok(stream) => {
                failures = 0;
                backoff.reset();
                connected(stream).await;
            }
            Err(error) => {
                failures += 1;
                metrics.dial_failed(hello.to.0, label(hello.lane));
                if failures == 1 || failures.is_multiple_of(DIAL_FAILURES_PER_LOG) {
                    log_dial_failure(addr, &hello, &error, failures);
                }
            }
        }
        compio::time::sleep(backoff.next_delay()).await;
    }
}

fn log_dial_failure(addr: SocketAddr, hello: &Hello, error: &DialError, failures: u64) {
    let peer = hello.to.0;
    match hello.lane {
        Lane::Shard(shard) => {
            tracing::info!(peer, shard, %addr, %error, failures, "dialing a replica failed; retrying");
        }
        Lane::Forward => {
            tracing::info!(peer, %addr, %error, failures, "dialing a forward lane failed; retrying");
        }
    }
}

/// Writes the lane's queued frames until the queue closes or a write
/// fails, then shuts the socket down. A frame alone in the queue is
/// written as it is (moved, not copied); frames queued behind it are
/// coalesced with it into one write of up to [`WRITE_COALESCE_BYTES`].
pub async fn write_coalesced<F>(mut stream: compio::net::TcpStream, mut frames: mpsc::Receiver<F>)
where
    F: IoBuf + AsRef<[u8]> + 'static,
{
    while let Some(first) = frames.next().await {
        let next = if first.as_ref().len() < WRITE_COALESCE_BYTES {
            frames.try_recv().ok()
        } else {
            None
        };
        let written = match next {
            None => stream.write_all(first).await.0,
            Some(second) => {
                let mut buf = Vec::with_capacity(first.as_ref().len() + second.as_ref().len());
                buf.extend_from_slice(first.as_ref());
                buf.extend_from_slice(second.as_ref());
                while buf.len() < WRITE_COALESCE_BYTES {
                    match frames.try_recv() {
                        Ok(frame) => buf.extend_from_slice(frame.as_ref()),
                        Err(_) => break,
                    }
                }
                let BufResult(written, _) = stream.write_all(buf).await;
                written
            }
        };
        if written.is_err() {
            break;
        }
    }
    let _ = stream.shutdown().await;
}
