//! A `replog` process started by a test: it prints its serving line, the
//! handle reads the client address from it, and the process is killed
//! when the handle drops (so a failing test leaves nothing running).
#![allow(clippy::unwrap_used, dead_code)]

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// A running replica.
pub struct Replog {
    child: Child,
    /// Where its clients connect.
    pub addr: SocketAddr,
    /// The stdout lines before the serving line (the metrics line).
    pub banner: Vec<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Replog {
    /// A single replica on a free port, two shards, data in `data_dir`.
    pub fn start(data_dir: &Path) -> Self {
        let mut args: Vec<OsString> = vec!["--data-dir".into(), data_dir.into()];
        args.extend(["--listen", "127.0.0.1:0", "--shards", "2"].map(OsString::from));
        Self::start_with(&args)
    }

    /// `replog ARGS`, waiting (at most 90 s) for its serving line.
    pub fn start_with(args: &[OsString]) -> Self {
        let filter = std::env::var("REPLOG_TEST_LOG").unwrap_or("warn".into());
        Self::start_logging(args, &filter)
    }

    /// As [`Replog::start_with`], with the log filter `filter`; the log
    /// lines are kept ([`Replog::logged`]) and echoed to the test's
    /// stderr.
    pub fn start_logging(args: &[OsString], filter: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_replog"))
            .args(args)
            .env("RUST_LOG", filter)
            .env("REPLOG_ROOT_PASSWORD", "iggy")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let kept = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("{line}");
                kept.lock().unwrap().push(line);
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        // Generous: a restart after `kill -9` on a loaded 2-core machine
        // (tests of one binary run side by side) recovers its groups first.
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut banner = Vec::new();
        let line = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("serving") => break line,
                Ok(line) => banner.push(line),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let _ = child.kill();
                    panic!("replog printed no serving line within 90 s (args {args:?})");
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = child.wait();
                    let tail: Vec<String> =
                        log.lock().unwrap().iter().rev().take(20).cloned().collect();
                    panic!(
                        "replog exited before its serving line ({status:?}, args {args:?}); last log lines, newest first: {tail:#?}"
                    );
                }
            }
        };
        let addr = line
            .split_whitespace()
            .find_map(|w| w.parse::<SocketAddr>().ok())
            .unwrap_or_else(|| panic!("no address in {line:?}"));
        Self {
            child,
            addr,
            banner,
            log,
        }
    }

    /// Where its metrics endpoint listens, from its `metrics on` line.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.banner.iter().find_map(|line| {
            let url = line.split("metrics on http://").nth(1)?;
            url.split('/').next()?.parse().ok()
        })
    }

    /// Whether a log line so far contains `needle`.
    pub fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// The log lines so far that contain `needle`.
    pub fn log_lines(&self, needle: &str) -> Vec<String> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|l| l.contains(needle)).cloned().collect()
    }

    /// Whether a log line containing `needle` arrives within `timeout`
    /// (the line may trail what the test observed on disk: the process
    /// writes it after the step, and a thread relays stderr).
    pub fn logged_within(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.logged(needle) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then wait (at most 20 s) for a clean exit.
    pub fn stop(mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "replog exited with {status}");
                return;
            }
            assert!(Instant::now() < deadline, "replog did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no flush, no goodbye.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
