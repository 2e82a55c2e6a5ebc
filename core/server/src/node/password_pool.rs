//! Password checks off the shard threads.
//!
//! Argon2 is slow by design (tens of milliseconds and megabytes per
//! check); run on a shard thread, every login would stall the groups that
//! shard hosts. A few OS threads verify instead, fed by a bounded queue:
//! past [`PasswordPool::QUEUE_MAX`] checks waiting, a login is answered
//! busy at once (the listener's per-address delay after failures keeps one
//! client from filling it).
//!
//! A login naming no user is checked against a dummy hash of the same
//! cost, so its answer takes as long as a wrong password's and its timing
//! does not tell which names exist.

use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use futures::channel::oneshot;
use metadata::{HashParams, PasswordHash};

/// One check: the hash, the password, and whether the user exists (an
/// unknown user's check runs against the dummy hash and never matches).
struct Job {
    hash: PasswordHash,
    known: bool,
    password: String,
    answer: oneshot::Sender<bool>,
}

/// The pool; cloned handles share its threads, which stop when the last
/// handle is dropped.
#[derive(Clone)]
pub struct PasswordPool {
    jobs: SyncSender<Job>,
    /// The queue's receiving end, held so a send fails only when full.
    _queue: Arc<Mutex<Receiver<Job>>>,
    dummy: Arc<PasswordHash>,
}

impl std::fmt::Debug for PasswordPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordPool").finish_non_exhaustive()
    }
}

/// The queue is full: too many password checks are waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

impl PasswordPool {
    /// Threads checking passwords.
    pub const THREADS: usize = 2;
    /// Checks waiting at most.
    pub const QUEUE_MAX: usize = 64;

    /// Starts [`Self::THREADS`] threads and hashes the dummy password.
    ///
    /// # Errors
    /// A sentence if the dummy hash or a thread cannot be made.
    pub fn start() -> Result<Self, String> {
        Self::start_with(Self::THREADS, Self::QUEUE_MAX)
    }

    fn start_with(threads: usize, queue: usize) -> Result<Self, String> {
        // The cost of every stored hash (HashParams::default), so an
        // unknown name costs what a known one does.
        let dummy =
            metadata::hash_password("replog: no such user", &[0x5A; 16], HashParams::default())
                .map_err(|e| format!("hashing the dummy password: {e}"))?;
        let (jobs, queue_rx) = std::sync::mpsc::sync_channel(queue);
        let queue_rx = Arc::new(Mutex::new(queue_rx));
        for i in 0..threads {
            let queue_rx = Arc::clone(&queue_rx);
            std::thread::Builder::new()
                .name(format!("replog-passwd-{i}"))
                .spawn(move || work(&queue_rx))
                .map_err(|e| format!("starting a password-check thread: {e}"))?;
        }
        Ok(Self {
            jobs,
            _queue: queue_rx,
            dummy: Arc::new(dummy),
        })
    }

    /// Whether `password` matches `hash`; an unknown user (`None`) is
    /// checked against the dummy hash and never matches.
    ///
    /// # Errors
    /// [`Busy`] when [`Self::QUEUE_MAX`] checks are waiting already (or the
    /// threads are gone).
    pub async fn verify(&self, hash: Option<PasswordHash>, password: &str) -> Result<bool, Busy> {
        let (answer, answered) = oneshot::channel();
        let known = hash.is_some();
        let job = Job {
            hash: hash.unwrap_or_else(|| PasswordHash::clone(&self.dummy)),
            known,
            password: password.to_owned(),
            answer,
        };
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => return Err(Busy),
        }
        answered.await.map_err(|_| Busy)
    }
}

fn work(queue: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let Ok(queue) = queue.lock() else {
                return;
            };
            match queue.recv() {
                Ok(job) => job,
                Err(_) => return, // every handle dropped
            }
        };
        // The same work either way; an unknown user never matches.
        let matched = metadata::verify_password(&job.hash, &job.password) && job.known;
        let _ = job.answer.send(matched);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cheap(password: &str) -> PasswordHash {
        let params = HashParams {
            memory_kib: 8,
            iterations: 1,
            parallelism: 1,
        };
        metadata::hash_password(password, &[1; 16], params).unwrap()
    }

    #[test]
    fn given_hashes_when_verified_off_thread_should_match_only_the_right_password() {
        let pool = PasswordPool::start_with(1, 4).unwrap();
        let hash = cheap("secret");
        futures::executor::block_on(async {
            assert_eq!(pool.verify(Some(hash.clone()), "secret").await, Ok(true));
            assert_eq!(pool.verify(Some(hash), "wrong").await, Ok(false));
            assert_eq!(
                pool.verify(None, "replog: no such user").await,
                Ok(false),
                "an unknown user never matches, even the dummy's own password"
            );
        });
    }

    #[test]
    fn given_a_full_queue_when_verifying_should_answer_busy_at_once() {
        use futures::FutureExt;
        // No worker: the queue only fills.
        let pool = PasswordPool::start_with(0, 2).unwrap();
        let hash = cheap("x");
        assert_eq!(pool.verify(Some(hash.clone()), "x").now_or_never(), None);
        assert_eq!(pool.verify(Some(hash.clone()), "x").now_or_never(), None);
        assert_eq!(
            pool.verify(Some(hash), "x").now_or_never(),
            Some(Err(Busy)),
            "the third waits for nothing"
        );
    }
}
