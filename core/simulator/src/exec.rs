//! Running the shard's futures on the driver's thread.
//!
//! Every future the shard hands out completes without waiting on anything
//! outside it: `SimFs` answers at once, or (in runs with slow disks) after
//! suspending once per sync and per yield, waking itself; the inboxes
//! between shards are drained by the driver. So the driver polls each
//! future with a no-op waker until it is ready — the futures inside it
//! that woke themselves run in the order their combinators poll them,
//! which is fixed, so a run stays deterministic — and a future still
//! pending after [`POLLS_MAX`] polls is a bug (a shard waiting on a full
//! sibling inbox, or on I/O that never completes) reported as [`Stalled`]
//! with what was being run — never a hang.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// The most polls one future gets before it counts as stalled: far more
/// than the suspensions of the longest chain of syncs one step makes.
pub(crate) const POLLS_MAX: u32 = 100_000;

/// A future that did not complete within [`POLLS_MAX`] polls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stalled {
    /// What the driver was running.
    pub what: &'static str,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} did not complete within {POLLS_MAX} polls (a shard waited on something the driver never provides)",
            self.what
        )
    }
}

impl std::error::Error for Stalled {}

/// Polls `future` until it is ready and returns its output.
///
/// # Errors
/// [`Stalled`] when it is still pending after [`POLLS_MAX`] polls.
pub(crate) fn run_now<F: Future>(what: &'static str, future: F) -> Result<F::Output, Stalled> {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..POLLS_MAX {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return Ok(out);
        }
    }
    Err(Stalled { what })
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
    fn given_future_that_suspends_a_few_times_when_run_should_return_its_output() {
        let mut left = 3;
        let suspending = std::future::poll_fn(move |cx| {
            if left == 0 {
                return Poll::Ready(9);
            }
            left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        });
        assert_eq!(run_now("suspending", suspending), Ok(9));
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
