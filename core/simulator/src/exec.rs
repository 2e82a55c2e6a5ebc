//! Running the shard's futures on the driver's thread.
//!
//! Every future the shard hands out completes without waiting on anything
//! outside it: `SimFs` answers at once, or (in runs with slow disks) after
//! suspending once per sync and per yield, waking itself; the inboxes
//! between shards are drained by the driver. So a step's futures — one
//! per shard that has work, as each core of a real replica runs its own
//! shard — run side by side ([`Executor::run_side_by_side`]): the executor polls one
//! woken task at a time, chosen by a seeded draw, so shards interleave
//! at their suspensions (two shards of a replica meeting at its disk, a
//! frame sent before or after another shard's) in an order the seed
//! replays. Inside one task, the futures that woke themselves run in the
//! order their combinators poll them, which is fixed. A task still
//! pending after [`POLLS_MAX`] polls, or pending with nothing left to
//! wake it, is a bug (a shard waiting on a full sibling inbox, on a timer,
//! or on I/O that never completes) reported as [`Stalled`] with what was
//! being run — never a hang.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use common::Prng;

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

/// A task's wake flag: set by its waker, cleared when it is polled.
#[derive(Debug)]
struct Woken(AtomicBool);

impl Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One future of a step and what became of it.
struct Task<'a, T> {
    future: Pin<Box<dyn Future<Output = T> + 'a>>,
    woken: Arc<Woken>,
    waker: Waker,
    output: Option<T>,
}

/// The executor of a run's steps: its seeded choices and what they did.
#[derive(Debug)]
pub(crate) struct Executor {
    prng: Prng,
    /// Polls of one task while another polled before it was still
    /// pending: how often a step's shards interleaved.
    switches: u64,
}

impl Executor {
    /// An executor whose choices follow `seed`.
    pub(crate) fn new(seed: u64) -> Self {
        Self {
            prng: Prng::new(seed),
            switches: 0,
        }
    }

    /// Interleavings so far (see [`Executor::switches`]'s field).
    pub(crate) fn switches(&self) -> u64 {
        self.switches
    }

    /// Runs `futures` side by side until every one is ready and returns
    /// their outputs in the order given. Each round polls one task chosen
    /// by the seed among those woken since their last poll (all are, at
    /// first).
    ///
    /// # Errors
    /// [`Stalled`] when a task is still pending after [`POLLS_MAX`] polls
    /// of its own, or when tasks are pending and none is woken.
    pub(crate) fn run_side_by_side<'a, T>(
        &mut self,
        what: &'static str,
        futures: Vec<Pin<Box<dyn Future<Output = T> + 'a>>>,
    ) -> Result<Vec<T>, Stalled> {
        let mut tasks: Vec<Task<'a, T>> = futures
            .into_iter()
            .map(|future| {
                let woken = Arc::new(Woken(AtomicBool::new(true)));
                let waker = Waker::from(Arc::clone(&woken));
                Task {
                    future,
                    woken,
                    waker,
                    output: None,
                }
            })
            .collect();
        let polls_max = u64::from(POLLS_MAX).saturating_mul(tasks.len() as u64);
        let mut ready: Vec<usize> = Vec::with_capacity(tasks.len());
        let mut last_pending: Option<usize> = None;
        // One more round than polls, to see the last task finish.
        for _ in 0..=polls_max {
            ready.clear();
            ready.extend(
                tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.output.is_none() && t.woken.0.load(Ordering::Relaxed))
                    .map(|(i, _)| i),
            );
            let chosen = match ready.len() {
                0 if tasks.iter().all(|t| t.output.is_some()) => {
                    return Ok(tasks.into_iter().filter_map(|t| t.output).collect());
                }
                0 => return Err(Stalled { what }),
                // One candidate costs no draw, so steps with nothing to
                // interleave leave the stream alone.
                1 => ready[0],
                n => ready[self.prng.below(n as u64) as usize],
            };
            if last_pending.is_some_and(|last| last != chosen) {
                self.switches += 1;
            }
            let task = &mut tasks[chosen];
            task.woken.0.store(false, Ordering::Relaxed);
            let mut cx = Context::from_waker(&task.waker);
            if let Poll::Ready(out) = task.future.as_mut().poll(&mut cx) {
                task.output = Some(out);
                last_pending = None;
            } else {
                last_pending = Some(chosen);
            }
        }
        Err(Stalled { what })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::cell::RefCell;

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

    /// A future that suspends `times` times (waking itself), recording
    /// `name` in `log` at each poll.
    fn suspending<'a>(
        name: char,
        times: u32,
        log: &'a RefCell<Vec<char>>,
    ) -> Pin<Box<dyn Future<Output = char> + 'a>> {
        let mut left = times;
        Box::pin(std::future::poll_fn(move |cx| {
            log.borrow_mut().push(name);
            if left == 0 {
                return Poll::Ready(name);
            }
            left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }))
    }

    #[test]
    fn given_tasks_that_suspend_when_run_side_by_side_should_interleave_by_seed_and_keep_order() {
        let run = |seed| {
            let log = RefCell::new(Vec::new());
            let futures = vec![
                suspending('a', 4, &log),
                suspending('b', 4, &log),
                suspending('c', 4, &log),
            ];
            let out = Executor::new(seed)
                .run_side_by_side("three", futures)
                .unwrap();
            assert_eq!(out, vec!['a', 'b', 'c'], "outputs keep the given order");
            log.into_inner()
        };
        let a = run(1);
        assert_eq!(a, run(1), "one seed, one interleaving");
        assert_eq!(a.len(), 15);
        assert!(
            (2..40).any(|seed| run(seed) != a),
            "the seed never changed the interleaving"
        );
        assert_ne!(
            a,
            "aaaaabbbbbccccc".chars().collect::<Vec<_>>(),
            "tasks ran one after another"
        );
    }

    #[test]
    fn given_a_task_nothing_wakes_when_run_side_by_side_should_report_stalled() {
        let log = RefCell::new(Vec::new());
        let never: Pin<Box<dyn Future<Output = char>>> = Box::pin(std::future::pending());
        let futures = vec![suspending('a', 2, &log), never];
        assert_eq!(
            Executor::new(5)
                .run_side_by_side("one stuck", futures)
                .err(),
            Some(Stalled { what: "one stuck" })
        );
    }

    #[test]
    fn given_no_tasks_when_run_side_by_side_should_return_nothing() {
        let futures: Vec<Pin<Box<dyn Future<Output = ()>>>> = Vec::new();
        assert_eq!(
            Executor::new(1).run_side_by_side("none", futures),
            Ok(vec![])
        );
    }
}
