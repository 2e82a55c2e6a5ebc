//! Test support for the tools (`replog-bench`, `replog-cli`): a real
//! `replog` process on a free loopback port with its own data directory,
//! stopped when its handle drops — the pattern of
//! `core/server/tests/replog_sdk.rs`, shared by the tools' tests.
//!
//! # Finding the `replog` binary
//!
//! Cargo gives `CARGO_BIN_EXE_replog` only to the server crate's own tests,
//! and artifact dependencies are not stable, so a tool's test finds the
//! binary itself:
//!
//! 1. `REPLOG_BIN`, when set, names the binary to run (nothing is built).
//! 2. Otherwise the test executable sits in `target/<profile>/deps/`; the
//!    binary belongs in `target/<profile>/replog`. If that binary is newer
//!    than every file of the server's sources (`core/`, the workspace
//!    `Cargo.toml` and `Cargo.lock`), it is used as it is: that is the case
//!    under `cargo test --workspace`, which builds it for the server's own
//!    tests before any test runs.
//! 3. Otherwise [`replog_binary`] runs `cargo build -p server --bin replog`
//!    for that profile and target directory, so a test never runs a server
//!    older than its sources. (Always building would not be free: a
//!    `cargo build -p server` resolves other features than a workspace-wide
//!    `cargo test`, so it would compile much of the server's graph a second
//!    time.) Cargo releases its build lock before it runs test executables,
//!    so the nested build does not wait on the outer one.
//!
//! A cross-compiled layout (`target/<triple>/<profile>/`) is not guessed:
//! set `REPLOG_BIN` there.

//!
//! # The tools' connection flags
//!
//! With the feature `flags`, [`connection::Connection`] is the one
//! definition of `--addr`, `--username` and `--password` that both tools'
//! binaries flatten into their command lines.

#[cfg(feature = "flags")]
pub mod connection;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{OnceLock, mpsc};
use std::time::{Duration, Instant};

/// Why the `replog` binary could not be had or started.
#[derive(Debug)]
pub enum ReplogError {
    /// The test executable's path does not look like `target/<profile>/deps/<exe>`.
    UnknownLayout {
        /// The test executable.
        exe: PathBuf,
    },
    /// `cargo build` could not be run or failed.
    Build {
        /// The command line that was run.
        command: String,
        /// What went wrong.
        detail: String,
    },
    /// The process could not be spawned.
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The OS error.
        detail: String,
    },
    /// The process did not print its serving line in time.
    NotServing {
        /// The binary.
        binary: PathBuf,
        /// What was seen instead.
        detail: String,
    },
}

impl std::fmt::Display for ReplogError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnknownLayout { exe } => write!(
                f,
                "the test executable {} is not under target/<profile>/deps/; set REPLOG_BIN to the replog binary",
                exe.display()
            ),
            Self::Build { command, detail } => {
                write!(f, "building replog with `{command}` failed: {detail}")
            }
            Self::Spawn { binary, detail } => {
                write!(f, "could not start {}: {detail}", binary.display())
            }
            Self::NotServing { binary, detail } => write!(
                f,
                "{} did not report a serving address: {detail}",
                binary.display()
            ),
        }
    }
}

impl std::error::Error for ReplogError {}

/// The `replog` binary to test against (see the crate documentation),
/// built once per test process.
pub fn replog_binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| locate_or_build().map_err(|e| e.to_string()))
        .clone()
}

fn locate_or_build() -> Result<PathBuf, ReplogError> {
    if let Some(path) = std::env::var_os("REPLOG_BIN") {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().map_err(|e| ReplogError::Build {
        command: "current_exe".into(),
        detail: e.to_string(),
    })?;
    let layout = TargetLayout::of_test_executable(&exe)
        .ok_or_else(|| ReplogError::UnknownLayout { exe: exe.clone() })?;
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let binary = layout.profile_dir.join("replog");
    if is_newer_than_sources(&binary, &workspace) {
        return Ok(binary);
    }
    // The cargo that built this crate (the pinned toolchain): a bare
    // `cargo` from PATH may resolve to another toolchain and rebuild the
    // whole target directory with it.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| env!("CARGO").into());
    let workspace_manifest = workspace.join("Cargo.toml");
    let mut command = Command::new(&cargo);
    command
        .arg("build")
        .arg("--manifest-path")
        .arg(&workspace_manifest)
        .args([
            "-p",
            "server",
            "--bin",
            "replog",
            "--profile",
            &layout.profile,
        ])
        .arg("--target-dir")
        .arg(&layout.target_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let shown = format!(
        "{} build -p server --bin replog --profile {} --target-dir {}",
        Path::new(&cargo).display(),
        layout.profile,
        layout.target_dir.display()
    );
    let output = command.output().map_err(|e| ReplogError::Build {
        command: shown.clone(),
        detail: e.to_string(),
    })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        return Err(ReplogError::Build {
            command: shown,
            detail: format!(
                "{}\n{}",
                output.status,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ),
        });
    }
    Ok(binary)
}

/// The crates the `replog` binary is built from.
const BINARY_CRATES: [&str; 8] = [
    "common",
    "consensus",
    "journal",
    "metadata",
    "partitions",
    "server",
    "shard",
    "storage",
];

/// Whether `binary` exists and was modified after every file it is built
/// from: the `src/` trees and manifests of [`BINARY_CRATES`]. Only what
/// cargo would relink the binary for counts: a changed test file, another
/// crate or a lock entry of the tools leaves the binary as it is, and
/// counting them would send a test into a `cargo build` that waits on the
/// lock its own `cargo test` holds. Any doubt (a missing file, an
/// unreadable time) says no.
fn is_newer_than_sources(binary: &Path, workspace: &Path) -> bool {
    let Ok(built) = std::fs::metadata(binary).and_then(|m| m.modified()) else {
        return false;
    };
    BINARY_CRATES
        .iter()
        .flat_map(|c| {
            let dir = workspace.join("core").join(c);
            [dir.join("src"), dir.join("Cargo.toml")]
        })
        .all(|root| newest_mtime(&root).is_some_and(|newest| newest <= built))
}

/// The newest modification time of `path` and, for a directory, of
/// everything below it; `None` if any of it cannot be read.
fn newest_mtime(path: &Path) -> Option<std::time::SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    let mut newest = meta.modified().ok()?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path).ok()? {
            let t = newest_mtime(&entry.ok()?.path())?;
            newest = newest.max(t);
        }
    }
    Some(newest)
}

/// Where a test executable sits: `<target_dir>/<profile dir>/deps/<exe>`.
#[derive(Debug, PartialEq, Eq)]
struct TargetLayout {
    target_dir: PathBuf,
    profile_dir: PathBuf,
    /// The cargo profile name (`dev` builds into `debug/`).
    profile: String,
}

impl TargetLayout {
    fn of_test_executable(exe: &Path) -> Option<Self> {
        let deps = exe.parent()?;
        if deps.file_name()? != "deps" {
            return None;
        }
        let profile_dir = deps.parent()?;
        let target_dir = profile_dir.parent()?;
        let dir_name = profile_dir.file_name()?.to_str()?;
        let profile = match dir_name {
            "debug" => "dev",
            other => other,
        };
        Some(Self {
            target_dir: target_dir.to_path_buf(),
            profile_dir: profile_dir.to_path_buf(),
            profile: profile.to_owned(),
        })
    }
}

/// A running `replog` on `127.0.0.1:<free port>`; killed when dropped.
pub struct Replog {
    child: Child,
    /// Where it serves the Iggy protocol.
    pub addr: SocketAddr,
}

impl Replog {
    /// Starts `replog` on a port it picks itself (`--listen 127.0.0.1:0`)
    /// with `data_dir`, two shards, and waits (at most 30 s) for the line
    /// that names its address.
    pub fn start(data_dir: &Path) -> Result<Self, String> {
        let binary = replog_binary()?;
        Self::start_binary(&binary, data_dir).map_err(|e| e.to_string())
    }

    fn start_binary(binary: &Path, data_dir: &Path) -> Result<Self, ReplogError> {
        let mut child = Command::new(binary)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--listen", "127.0.0.1:0", "--shards", "2"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| ReplogError::Spawn {
                binary: binary.to_path_buf(),
                detail: e.to_string(),
            })?;
        let not_serving = |detail: String| ReplogError::NotServing {
            binary: binary.to_path_buf(),
            detail,
        };
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            return Err(not_serving("no stdout pipe".into()));
        };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let found = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains("serving") => {
                    break line
                        .split_whitespace()
                        .find_map(|w| w.parse::<SocketAddr>().ok())
                        .ok_or_else(|| format!("no address in {line:?}"));
                }
                Ok(_) => continue,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    break Err("no serving line within 30 s".into());
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(format!("exited first ({:?})", child.try_wait()));
                }
            }
        };
        match found {
            Ok(addr) => Ok(Self { child, addr }),
            Err(detail) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(not_serving(detail))
            }
        }
    }

    /// SIGTERM, then wait (at most 20 s) for a clean exit.
    pub fn stop(mut self) -> Result<(), String> {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => return Err(format!("replog exited with {status}")),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) => return Err("replog did not stop within 20 s of SIGTERM".into()),
                Err(e) => return Err(format!("waiting for replog: {e}")),
            }
        }
    }
}

impl Drop for Replog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a bounded command printed, and how it ended.
#[derive(Debug)]
pub struct Finished {
    /// The exit status.
    pub status: std::process::ExitStatus,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// Runs `command` with `stdin` fed to it, killing it after `limit`; an
/// error says which limit was hit or what could not be done.
pub fn run_bounded(
    mut command: Command,
    stdin: &[u8],
    limit: Duration,
) -> Result<Finished, String> {
    use std::io::{Read, Write};
    let shown = format!("{command:?}");
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start {shown}: {e}"))?;
    if let Some(mut pipe) = child.stdin.take() {
        let input = stdin.to_vec();
        // Written from a thread: a child that does not read its stdin
        // must not block this one.
        std::thread::spawn(move || {
            let _ = pipe.write_all(&input);
        });
    }
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{shown} did not finish within {limit:?}"));
            }
            Err(e) => return Err(format!("waiting for {shown}: {e}")),
        }
    };
    Ok(Finished {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_a_dev_test_executable_when_located_should_name_the_dev_profile_and_its_target_dir() {
        let layout =
            TargetLayout::of_test_executable(Path::new("/w/target/debug/deps/cli-0123abcd"));
        assert_eq!(
            layout,
            Some(TargetLayout {
                target_dir: PathBuf::from("/w/target"),
                profile_dir: PathBuf::from("/w/target/debug"),
                profile: "dev".into(),
            })
        );
    }

    #[test]
    fn given_a_release_test_executable_when_located_should_name_the_release_profile() {
        let layout =
            TargetLayout::of_test_executable(Path::new("/w/target/release/deps/cli-0123abcd"))
                .map(|l| l.profile);
        assert_eq!(layout.as_deref(), Some("release"));
    }

    fn touch(path: &Path, at: std::time::SystemTime) {
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(at)
            .unwrap();
    }

    #[test]
    fn given_a_binary_older_than_a_source_when_checked_should_rebuild() {
        let dir = tempfile::tempdir().unwrap();
        let w = dir.path();
        let t0 = std::time::SystemTime::now() - Duration::from_secs(100);
        for c in BINARY_CRATES {
            let crate_dir = w.join("core").join(c);
            std::fs::create_dir_all(crate_dir.join("src")).unwrap();
            std::fs::create_dir_all(crate_dir.join("tests")).unwrap();
            for f in ["src/lib.rs", "Cargo.toml", "tests/t.rs"] {
                std::fs::write(crate_dir.join(f), "x").unwrap();
                touch(&crate_dir.join(f), t0);
            }
            std::fs::File::open(crate_dir.join("src"))
                .unwrap()
                .set_modified(t0)
                .unwrap();
        }
        std::fs::write(w.join("replog"), "x").unwrap();
        touch(&w.join("replog"), t0 + Duration::from_secs(10));
        assert!(is_newer_than_sources(&w.join("replog"), w));
        // A test file, the lock or another crate edited after the build:
        // cargo does not relink the binary for them, so neither does this.
        touch(
            &w.join("core/server/tests/t.rs"),
            t0 + Duration::from_secs(20),
        );
        std::fs::write(w.join("Cargo.lock"), "x").unwrap();
        std::fs::create_dir_all(w.join("core/simulator/src")).unwrap();
        std::fs::write(w.join("core/simulator/src/lib.rs"), "x").unwrap();
        assert!(is_newer_than_sources(&w.join("replog"), w));
        // A source of the binary edited after the build: stale.
        touch(
            &w.join("core/metadata/src/lib.rs"),
            t0 + Duration::from_secs(20),
        );
        assert!(!is_newer_than_sources(&w.join("replog"), w));
        // No binary at all: build.
        assert!(!is_newer_than_sources(&w.join("missing"), w));
    }

    #[test]
    fn given_an_executable_outside_deps_when_located_should_refuse() {
        assert_eq!(
            TargetLayout::of_test_executable(Path::new("/usr/bin/true")),
            None
        );
    }
}
