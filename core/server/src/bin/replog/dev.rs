//! `replog dev --replicas N`: a local cluster on loopback for trying
//! things out. Each replica is a child process running this binary with
//! a generated configuration (`<data_dir>/dev/r<N>.toml`, data in
//! `<data_dir>/dev/r<N>`). The parent prints every replica's addresses,
//! prefixes each child's output with its replica, and on Ctrl-C or
//! SIGTERM closes the children's stdin, which stops them cleanly (so
//! they stop too if the parent dies).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use server::config::{CLUSTER_SECRET_ENV, Config, DevArgs, ROOT_PASSWORD_ENV, RosterEntry};

/// How long a child may take to stop after its stdin closed.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

pub fn run(base: &Config, args: &DevArgs) -> ExitCode {
    let roster = match args.roster() {
        Ok(roster) => roster,
        Err(e) => {
            eprintln!("replog dev: {e}");
            return ExitCode::from(2);
        }
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            eprintln!("replog dev: cannot find this binary to start the replicas: {e}");
            return ExitCode::from(1);
        }
    };
    let dev_dir = base.data_dir.join("dev");
    // A replica whose directory is gone while another's holds a cluster
    // rejoins (its disk was "replaced"); all empty is a new cluster.
    let started = |id: u8| dev_dir.join(format!("r{id}")).join("replica.id").exists();
    let cluster_exists = roster.iter().any(|r| started(r.id));
    // The replicas prove a cluster secret to each other: the operator's
    // (a file in the configuration or the environment, which the children
    // inherit), else a fresh one for this run, passed in the environment.
    let secret =
        if base.replica.secret_file.is_some() || std::env::var_os(CLUSTER_SECRET_ENV).is_some() {
            None
        } else {
            match server::node::bus::auth::fresh_secret() {
                Ok(secret) => Some(secret),
                Err(e) => {
                    eprintln!("replog dev: drawing a cluster secret from /dev/urandom: {e}");
                    return ExitCode::from(1);
                }
            }
        };
    let mut children: Vec<(u8, Child)> = Vec::new();
    for entry in &roster {
        let rejoin = cluster_exists && !started(entry.id) && roster.len() > 1;
        match start_replica(
            base,
            &roster,
            entry,
            &dev_dir,
            &exe,
            rejoin,
            secret.as_deref(),
        ) {
            Ok(child) => children.push((entry.id, child)),
            Err((code, message)) => {
                eprintln!("replog dev: {message}");
                stop_all(children);
                return code;
            }
        }
    }
    // Announced once the stop signals are caught (see main.rs).
    super::wait_for_stop_signal(false, || {
        println!(
            "replog dev: {} replicas running; connect with iggy://{}:<password>@{}; Ctrl-C stops them",
            roster.len(),
            base.root.username,
            roster[0].client_address
        );
    });
    println!("replog dev: stopping");
    if stop_all(children) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// Writes replica `entry`'s configuration, starts it with its output
/// prefixed, and prints its addresses; on failure, the exit code and what
/// went wrong.
fn start_replica(
    base: &Config,
    roster: &[RosterEntry],
    entry: &RosterEntry,
    dev_dir: &Path,
    exe: &Path,
    rejoin: bool,
    secret: Option<&str>,
) -> Result<Child, (ExitCode, String)> {
    let config = replica_config(base, roster, entry, dev_dir)?;
    let file = dev_dir.join(format!("r{}.toml", entry.id));
    write_config(&config, &file).map_err(|e| {
        (
            ExitCode::from(1),
            format!("writing {}: {e}", file.display()),
        )
    })?;
    if rejoin {
        println!(
            "replog dev: replica {} has no data but the cluster does: it rejoins",
            entry.id
        );
    }
    // The password and the secret travel in the environment, not in the
    // file.
    let mut command = Command::new(exe);
    command
        .arg("--config")
        .arg(&file)
        .arg("--exit-with-stdin")
        .args(rejoin.then_some("--rejoin"))
        .env(ROOT_PASSWORD_ENV, &base.root.password);
    if let Some(secret) = secret {
        command.env(CLUSTER_SECRET_ENV, secret);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            (
                ExitCode::from(1),
                format!("starting replica {}: {e}", entry.id),
            )
        })?;
    prefix_output(entry.id, &mut child);
    let metrics = config
        .metrics
        .listen
        .map_or_else(String::new, |addr| format!(" metrics {addr}"));
    println!(
        "replog dev: replica {} clients {} replicas {}{metrics} data {}",
        entry.id,
        entry.client_address,
        entry.replica_address,
        config.data_dir.display()
    );
    Ok(child)
}

/// Replica `entry`'s configuration: the base one with its own data
/// directory, addresses and the whole roster.
fn replica_config(
    base: &Config,
    roster: &[RosterEntry],
    entry: &RosterEntry,
    dev_dir: &Path,
) -> Result<Config, (ExitCode, String)> {
    let mut config = base.clone();
    config.data_dir = dev_dir.join(format!("r{}", entry.id));
    config.replica_id = entry.id;
    config.client.listen = entry.client_address;
    config.replica.listen = entry.replica_address;
    config.replicas = roster.to_vec();
    // Each replica its own metrics port: the configured one plus its
    // id (port 0 stays 0, a free port each).
    config.metrics.listen = match base.metrics.listen {
        Some(mut addr) if addr.port() != 0 => {
            let Some(port) = addr.port().checked_add(u16::from(entry.id)) else {
                return Err((
                    ExitCode::from(2),
                    "the metrics ports run past 65535".to_owned(),
                ));
            };
            addr.set_port(port);
            Some(addr)
        }
        other => other,
    };
    Ok(config)
}

fn write_config(config: &Config, file: &Path) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(file, config.to_toml_redacted())
}

/// Copies a child's stdout and stderr to ours, each line prefixed.
fn prefix_output(id: u8, child: &mut Child) {
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                println!("[r{id}] {line}");
            }
        });
    }
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("[r{id}] {line}");
            }
        });
    }
}

/// Closes every child's stdin and waits for it; kills what does not stop
/// in time. True when every child exited cleanly.
fn stop_all(children: Vec<(u8, Child)>) -> bool {
    let mut clean = true;
    let mut waiting = Vec::new();
    for (id, mut child) in children {
        drop(child.stdin.take());
        waiting.push((id, child));
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    for (id, mut child) in waiting {
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        eprintln!("replog dev: replica {id} exited with {status}");
                        clean = false;
                    }
                    break;
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    eprintln!("replog dev: replica {id} did not stop in time; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    clean = false;
                    break;
                }
            }
        }
    }
    clean
}
