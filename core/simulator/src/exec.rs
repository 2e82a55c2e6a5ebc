//! Running the shard's futures on the driver's thread.
//!
//! Every future the shard hands out completes without waiting on anything
//! outside it: `SimFs` answers on the first poll and the inboxes between
//! shards are drained by the driver. So the driver polls each future once
//! with a no-op waker, and a future that is still pending is a bug (a
//! shard waiting on a full sibling inbox, or on I/O that never completes)
//! reported as [`Stalled`] with what was being run — never a hang.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// A future that did not complete on its first poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stalled {
    /// What the driver was running.
    pub what: &'static str,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} did not complete on its first poll (a shard waited on something the driver never provides)",
            self.what
        )
    }
}

impl std::error::Error for Stalled {}

/// Polls `future` once and returns its output.
///
/// # Errors
/// [`Stalled`] when it is pending.
pub(crate) fn run_now<F: Future>(what: &'static str, future: F) -> Result<F::Output, Stalled> {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(out) => Ok(out),
        Poll::Pending => Err(Stalled { what }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_ready_future_when_run_should_return_its_output() {
        assert_eq!(run_now("ready", async { 7 }), Ok(7));
    }

    #[test]
    fn given_pending_future_when_run_should_report_stalled() {
        let pending = std::future::pending::<()>();
        assert_eq!(
            run_now("pending", pending),
            Err(Stalled { what: "pending" })
        );
    }
}
