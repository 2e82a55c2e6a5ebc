//! A three-replica cluster of `replog` processes on loopback, started and
//! stopped by the bench: a roster file per replica (docs/configuration.md)
//! with ports picked free, data and logs in the run's directory, each
//! replica's metrics on a free port of its own.
//!
//! Every replica runs with `--exit-with-stdin` and its stdin a pipe from
//! the bench (as `replog dev` runs its children): closing the pipe stops it
//! cleanly, and so does the bench's death, however it dies, because the
//! pipe closes with it. [`Cluster`]'s `Drop` stops whatever still runs.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::ClusterError;

/// Replicas in the cluster.
pub const REPLICAS: usize = 3;
/// How long a replica may take to print its serving line.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a replica may take to stop once its stdin closed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// One replica's addresses and files.
#[derive(Debug, Clone)]
pub struct ReplicaSpec {
    /// Its id.
    pub id: u8,
    /// Where Iggy clients reach it.
    pub client: SocketAddr,
    /// Where the other replicas reach it.
    pub replica: SocketAddr,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its configuration file.
    pub config: PathBuf,
    /// Its stderr (the logs).
    pub log: PathBuf,
}

/// A running replica.
struct Running {
    child: Child,
    /// Closing it stops the replica.
    stdin: Option<ChildStdin>,
    /// Its metrics endpoint, from its stdout.
    metrics: SocketAddr,
}

/// The cluster; the processes are stopped when it drops.
pub struct Cluster {
    binary: PathBuf,
    /// The root user's password, passed in the environment (as `replog
    /// dev` does), not written to the files.
    password: String,
    /// The cluster secret the replicas prove to each other, drawn for this
    /// cluster and passed in the environment as well.
    secret: String,
    /// The replicas, by id.
    pub specs: Vec<ReplicaSpec>,
    running: Vec<Option<Running>>,
}

impl Cluster {
    /// Writes the roster files under `dir` (ports picked free now) with
    /// `username` as the root user and `extra` (TOML sections) appended to
    /// each; starts nothing.
    pub fn configure(
        binary: &Path,
        dir: &Path,
        shards: u32,
        username: &str,
        password: &str,
        extra: &str,
    ) -> Result<Self, ClusterError> {
        let ports = free_ports(2 * REPLICAS)?;
        let specs: Vec<ReplicaSpec> = (0..REPLICAS)
            .map(|i| ReplicaSpec {
                id: i as u8,
                client: SocketAddr::from(([127, 0, 0, 1], ports[2 * i])),
                replica: SocketAddr::from(([127, 0, 0, 1], ports[2 * i + 1])),
                data_dir: dir.join(format!("r{i}")),
                config: dir.join(format!("r{i}.toml")),
                log: dir.join(format!("r{i}.log")),
            })
            .collect();
        for spec in &specs {
            let text = roster_toml(spec, &specs, shards, username)? + extra;
            std::fs::write(&spec.config, text).map_err(|source| ClusterError::Io {
                what: format!("writing {}", spec.config.display()),
                source,
            })?;
        }
        let mut bytes = [0u8; 32];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").map_err(|source| ClusterError::Io {
                what: "opening /dev/urandom for a cluster secret".to_owned(),
                source,
            })?,
            &mut bytes,
        )
        .map_err(|source| ClusterError::Io {
            what: "reading a cluster secret from /dev/urandom".to_owned(),
            source,
        })?;
        Ok(Self {
            binary: binary.to_path_buf(),
            password: password.to_owned(),
            secret: bytes.iter().map(|b| format!("{b:02x}")).collect(),
            running: (0..specs.len()).map(|_| None).collect(),
            specs,
        })
    }

    /// Starts replica `id` (with `--rejoin` when its disk was "replaced")
    /// and waits for its serving line. Blocking.
    pub fn start(&mut self, id: usize, rejoin: bool) -> Result<(), ClusterError> {
        let spec = &self.specs[id];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .map_err(|source| ClusterError::Io {
                what: format!("opening {}", spec.log.display()),
                source,
            })?;
        let mut child = Command::new(&self.binary)
            .arg("--config")
            .arg(&spec.config)
            .arg("--exit-with-stdin")
            .args(rejoin.then_some("--rejoin"))
            .env("RUST_LOG", "info")
            .env("REPLOG_ROOT_PASSWORD", &self.password)
            .env("REPLOG_CLUSTER_SECRET", &self.secret)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|source| ClusterError::Spawn {
                binary: self.binary.clone(),
                source,
            })?;
        let stdin = child.stdin.take();
        let Some(stdout) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(self.not_serving(id, "no stdout pipe".into()));
        };
        let (tx, rx) = mpsc::channel();
        // Drains stdout to its end, so a late line never meets a closed
        // pipe; only the lines before the serving line are wanted.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        let mut metrics = None;
        let outcome = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(" metrics on http://") => {
                    metrics = line
                        .split("http://")
                        .nth(1)
                        .and_then(|rest| rest.split('/').next())
                        .and_then(|a| a.parse::<SocketAddr>().ok());
                }
                Ok(line) if line.contains("serving Iggy clients") => break Ok(()),
                Ok(_) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    break Err(format!("no serving line within {START_TIMEOUT:?}"));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(format!("it exited first ({:?})", child.try_wait()));
                }
            }
        };
        let outcome = outcome.and_then(|()| {
            metrics.ok_or_else(|| "it served without naming its metrics address".to_owned())
        });
        match outcome {
            Ok(metrics) => {
                self.running[id] = Some(Running {
                    child,
                    stdin,
                    metrics,
                });
                Ok(())
            }
            Err(detail) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(self.not_serving(id, detail))
            }
        }
    }

    fn not_serving(&self, id: usize, detail: String) -> ClusterError {
        ClusterError::NotServing {
            replica: id,
            binary: self.binary.clone(),
            log: self.specs[id].log.clone(),
            detail,
        }
    }

    /// Replica `id`'s process id, while it runs.
    pub fn pid(&self, id: usize) -> Option<u32> {
        self.running[id].as_ref().map(|r| r.child.id())
    }

    /// Replica `id`'s metrics endpoint, while it runs.
    pub fn metrics(&self, id: usize) -> Option<SocketAddr> {
        self.running[id].as_ref().map(|r| r.metrics)
    }

    /// Whether every started replica still runs; the first that exited.
    pub fn check_alive(&mut self) -> Result<(), ClusterError> {
        for (id, slot) in self.running.iter_mut().enumerate() {
            if let Some(r) = slot
                && let Ok(Some(status)) = r.child.try_wait()
            {
                *slot = None;
                return Err(ClusterError::Exited {
                    replica: id,
                    status: status.to_string(),
                    log: self.specs[id].log.clone(),
                });
            }
        }
        Ok(())
    }

    /// Stops replica `id` cleanly (its stdin closes), killing it after
    /// [`STOP_TIMEOUT`]. Blocking; an error if it had to be killed or
    /// exited with a failure.
    pub fn stop(&mut self, id: usize) -> Result<(), ClusterError> {
        let Some(mut r) = self.running[id].take() else {
            return Ok(());
        };
        drop(r.stdin.take());
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match r.child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(ClusterError::Exited {
                        replica: id,
                        status: status.to_string(),
                        log: self.specs[id].log.clone(),
                    });
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Ok(None) | Err(_) => {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                    return Err(ClusterError::Exited {
                        replica: id,
                        status: format!(
                            "killed: not stopped {STOP_TIMEOUT:?} after its stdin closed"
                        ),
                        log: self.specs[id].log.clone(),
                    });
                }
            }
        }
    }

    /// Kills replica `id` at once (SIGKILL: no clean stop, nothing flushed
    /// that was not already written) and reaps it. Blocking.
    pub fn kill(&mut self, id: usize) -> Result<(), ClusterError> {
        let Some(mut r) = self.running[id].take() else {
            return Ok(());
        };
        r.child.kill().map_err(|source| ClusterError::Io {
            what: format!("killing replica {id}"),
            source,
        })?;
        let _ = r.child.wait();
        Ok(())
    }

    /// Stops every running replica; the first error.
    pub fn stop_all(&mut self) -> Result<(), ClusterError> {
        // Close every stdin first, so they stop in parallel.
        for r in self.running.iter_mut().flatten() {
            drop(r.stdin.take());
        }
        let mut first = Ok(());
        for id in 0..self.running.len() {
            let stopped = self.stop(id);
            if first.is_ok() {
                first = stopped;
            }
        }
        first
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop_all();
    }
}

/// `n` distinct free loopback ports: all bound at once, then released. A
/// port may be taken by someone else before the replica binds it; the
/// replica then fails to start and says so.
fn free_ports(n: usize) -> Result<Vec<u16>, ClusterError> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ClusterError::Io {
            what: "binding 127.0.0.1:0 to pick free ports".into(),
            source,
        })?;
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(|source| ClusterError::Io {
                    what: "reading a picked port".into(),
                    source,
                })
        })
        .collect()
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Replica `me`'s configuration: its listeners, data directory, metrics on
/// a free port, `username` as its root user, and the roster of `all`.
fn roster_toml(
    me: &ReplicaSpec,
    all: &[ReplicaSpec],
    shards: u32,
    username: &str,
) -> Result<String, ClusterError> {
    let data_dir = me.data_dir.to_str().ok_or_else(|| ClusterError::Io {
        what: format!("using {} as a data directory", me.data_dir.display()),
        source: std::io::Error::other("the path is not UTF-8"),
    })?;
    let mut text = format!(
        "data_dir = {}\ncluster_id = 1\nreplica_id = {}\nshards = {shards}\n\n[client]\nlisten = \"{}\"\n\n[replica]\nlisten = \"{}\"\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n\n[root]\nusername = {}\n",
        toml_string(data_dir),
        me.id,
        me.client,
        me.replica,
        toml_string(username)
    );
    for r in all {
        text.push_str(&format!(
            "\n[[replicas]]\nid = {}\nclient_address = \"{}\"\nreplica_address = \"{}\"\n",
            r.id, r.client, r.replica
        ));
    }
    Ok(text)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_three_replicas_when_configured_should_write_a_roster_naming_every_one() {
        let spec = |i: u16| ReplicaSpec {
            id: i as u8,
            client: SocketAddr::from(([127, 0, 0, 1], 9000 + 2 * i)),
            replica: SocketAddr::from(([127, 0, 0, 1], 9001 + 2 * i)),
            data_dir: PathBuf::from(format!("/tmp/a \"b\"/r{i}")),
            config: PathBuf::new(),
            log: PathBuf::new(),
        };
        let all: Vec<_> = (0..3).map(spec).collect();
        let text = roster_toml(&all[1], &all, 2, "root").unwrap();
        assert!(text.contains("[root]\nusername = \"root\"\n"), "{text}");
        assert!(
            text.contains("data_dir = \"/tmp/a \\\"b\\\"/r1\"\n"),
            "{text}"
        );
        assert!(text.contains("replica_id = 1\nshards = 2\n"), "{text}");
        assert!(
            text.contains("[client]\nlisten = \"127.0.0.1:9002\""),
            "{text}"
        );
        assert!(
            text.contains("[replica]\nlisten = \"127.0.0.1:9003\""),
            "{text}"
        );
        assert_eq!(text.matches("[[replicas]]").count(), 3);
        assert!(text.contains(
            "id = 2\nclient_address = \"127.0.0.1:9004\"\nreplica_address = \"127.0.0.1:9005\""
        ));
    }

    #[test]
    fn given_ports_when_picked_should_be_distinct() {
        let mut ports = free_ports(6).unwrap();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 6);
    }
}
