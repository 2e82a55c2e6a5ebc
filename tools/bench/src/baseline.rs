//! The `baseline` mode's receiver: the least a server can do with the
//! producers' requests, so a run against it measures the path itself —
//! the SDK's encoding, loopback TCP and appending the bytes to a file —
//! and a pinned-producer run against replog can be read as a fraction of
//! it.
//!
//! It lives in the bench process, on 127.0.0.1 at a free port, one OS
//! thread per connection with blocking reads and writes (no async runtime
//! between the socket and the file). Each request frame is read by the
//! size in its 256-byte header (client_protocol.md §1–2); a send's frame
//! (operation 160), header and body, is appended as it is to the
//! connection's own file — one file per producer, as each pinned producer
//! has a partition of its own — and answered with an empty OK. Nothing in
//! a body is parsed. The few other requests an SDK producer sends before
//! its first send get the smallest replies the SDK accepts: the login
//! (operation 1) a session, `GET_CLUSTER_METADATA` (code 12) this one node
//! as the leader, `PING` (code 1) and logout (operation 3) an empty OK;
//! anything else is refused with `FeatureUnavailable` (5). Stream and topic
//! set-up is therefore not served: the baseline run skips it.
//!
//! The files are page-cache writes, never synced — what replog's
//! `replicated` durability does with a batch before its reply — and are
//! deleted when the receiver stops.

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde::Serialize;

use crate::error::BenchError;

/// The frame header's length (client_protocol.md §2).
const HEADER_SIZE: usize = 256;
/// The largest frame accepted, as replog's default
/// `client.frame_size_max_bytes`.
const FRAME_SIZE_MAX_BYTES: usize = 64 << 20;

// Request header fields (client_protocol.md §2.1–2.2).
const SIZE_AT: usize = 48;
const COMMAND_AT: usize = 60;
const CLIENT_AT: usize = 128;
const REQUEST_AT: usize = 168;
const OPERATION_AT: usize = 176;
const LEGACY_CODE_AT: usize = 196;
// Reply header fields (§2.3).
const REPLY_CLIENT_AT: usize = 160;
const REPLY_REQUEST_AT: usize = 200;
const REPLY_OPERATION_AT: usize = 208;
const REPLY_STATUS_AT: usize = 216;

const COMMAND_REQUEST: u8 = 5;
const COMMAND_REPLY: u8 = 8;
const OPERATION_REGISTER: u8 = 1;
const OPERATION_NON_REPLICATED: u8 = 2;
const OPERATION_LOGOUT: u8 = 3;
const OPERATION_SEND_MESSAGES: u8 = 160;
const CODE_PING: u32 = 1;
const CODE_GET_CLUSTER_METADATA: u32 = 12;
/// `IggyError::FeatureUnavailable`.
const STATUS_FEATURE_UNAVAILABLE: u32 = 5;
/// 0.11.0 packed as major << 20 | minor << 10 | patch.
const PROTOCOL_VERSION: u32 = 11 << 10;

/// What the receiver did, for the report.
#[derive(Debug, Clone, Serialize)]
pub struct ReceiverReport {
    /// Where its files were (deleted after the run).
    pub dir: PathBuf,
    /// Connections accepted.
    pub connections: u64,
    /// Files written: one per connection that sent.
    pub files: u64,
    /// Send frames appended.
    pub frames_appended: u64,
    /// Their bytes, headers included.
    pub bytes_appended: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    files: AtomicU64,
    frames: AtomicU64,
    bytes: AtomicU64,
    /// The first connection that failed, and why.
    failure: Mutex<Option<String>>,
}

impl Counters {
    fn fail(&self, why: String) {
        if let Ok(mut slot) = self.failure.lock() {
            slot.get_or_insert(why);
        }
    }
}

/// A running receiver; [`Receiver::stop`] ends it and deletes its files.
pub struct Receiver {
    addr: SocketAddr,
    dir: PathBuf,
    stopping: Arc<AtomicBool>,
    counters: Arc<Counters>,
    accept: Option<JoinHandle<()>>,
    connections: Arc<Mutex<Vec<Open>>>,
}

/// A connection's thread, and a handle on its socket to end it with.
struct Open {
    socket: TcpStream,
    thread: JoinHandle<()>,
}

impl Receiver {
    /// Binds 127.0.0.1 at a free port and starts accepting; its files go to
    /// a new directory under `parent` (the system's temporary directory when
    /// `None`).
    pub fn start(parent: Option<&Path>) -> Result<Self, BenchError> {
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let dir = unique_dir(&parent, "replog-bench-baseline")?;
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|source| BenchError::Receiver {
            what: "binding the baseline receiver to 127.0.0.1:0".into(),
            source,
        })?;
        let addr = listener
            .local_addr()
            .map_err(|source| BenchError::Receiver {
                what: "reading the baseline receiver's address".into(),
                source,
            })?;
        let stopping = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let connections = Arc::new(Mutex::new(Vec::new()));
        let accept = {
            let (stopping, counters, connections, dir) = (
                stopping.clone(),
                counters.clone(),
                connections.clone(),
                dir.clone(),
            );
            std::thread::Builder::new()
                .name("baseline-accept".into())
                .spawn(move || {
                    accept_loop(listener, addr, &dir, &stopping, &counters, &connections)
                })
                .map_err(|source| BenchError::Receiver {
                    what: "starting the baseline receiver's accept thread".into(),
                    source,
                })?
        };
        Ok(Self {
            addr,
            dir,
            stopping,
            counters,
            accept: Some(accept),
            connections,
        })
    }

    /// Where the producers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, waits for the connections to end (the producers
    /// have disconnected by then), deletes the files and reports; an error
    /// if any connection failed.
    pub fn stop(mut self) -> Result<ReceiverReport, BenchError> {
        self.shut_down();
        let report = ReceiverReport {
            dir: self.dir.clone(),
            connections: self.counters.connections.load(Ordering::SeqCst),
            files: self.counters.files.load(Ordering::SeqCst),
            frames_appended: self.counters.frames.load(Ordering::SeqCst),
            bytes_appended: self.counters.bytes.load(Ordering::SeqCst),
        };
        let failure = self.counters.failure.lock().map_or_else(
            |_| Some("a connection thread panicked".into()),
            |f| f.clone(),
        );
        if let Some(why) = failure {
            return Err(BenchError::Plan(format!(
                "the baseline receiver on {} failed: {why}",
                self.addr
            )));
        }
        Ok(report)
    }

    fn shut_down(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(accept) = self.accept.take() {
            // The accept thread blocks in accept(): one connection wakes it.
            let _ = TcpStream::connect(self.addr);
            let _ = accept.join();
        }
        // The producers are done; a client the SDK keeps open (its
        // heartbeat) is closed from this side so its thread ends.
        let open = self
            .connections
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        for o in open {
            let _ = o.socket.shutdown(std::net::Shutdown::Both);
            let _ = o.thread.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A fresh directory `<parent>/<prefix>-<pid>-<n>`.
pub fn unique_dir(parent: &Path, prefix: &str) -> Result<PathBuf, BenchError> {
    let pid = std::process::id();
    for n in 0..1000u32 {
        let dir = parent.join(format!("{prefix}-{pid}-{n}"));
        match std::fs::create_dir_all(parent).and_then(|()| std::fs::create_dir(&dir)) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(source) => {
                return Err(BenchError::Receiver {
                    what: format!("creating the directory {}", dir.display()),
                    source,
                });
            }
        }
    }
    Err(BenchError::Plan(format!(
        "no free directory name {prefix}-{pid}-N under {}",
        parent.display()
    )))
}

fn accept_loop(
    listener: TcpListener,
    addr: SocketAddr,
    dir: &Path,
    stopping: &Arc<AtomicBool>,
    counters: &Arc<Counters>,
    connections: &Mutex<Vec<Open>>,
) {
    for (index, incoming) in (0u64..).zip(listener.incoming()) {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let stream = match incoming {
            Ok(stream) => stream,
            Err(e) => {
                counters.fail(format!("accepting a connection on {addr}: {e}"));
                return;
            }
        };
        counters.connections.fetch_add(1, Ordering::SeqCst);
        let socket = match stream.try_clone() {
            Ok(socket) => socket,
            Err(e) => {
                counters.fail(format!("cloning a connection's socket on {addr}: {e}"));
                return;
            }
        };
        let path = dir.join(format!("connection-{index}.log"));
        let (thread_counters, stopping) = (counters.clone(), stopping.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("baseline-conn-{index}"))
            .spawn(move || {
                let counters = thread_counters;
                let peer = stream
                    .peer_addr()
                    .map_or_else(|_| "a client".to_owned(), |a| a.to_string());
                let mut connection = Connection {
                    stream,
                    path,
                    file: None,
                    session: index + 1,
                    port: addr.port(),
                    counters: &counters,
                };
                // After the stop, a connection cut mid-frame is this side's
                // doing, not a failure.
                if let Err(why) = connection.serve()
                    && !stopping.load(Ordering::SeqCst)
                {
                    counters.fail(format!("the connection from {peer}: {why}"));
                }
            });
        match spawned {
            Ok(thread) => {
                if let Ok(mut v) = connections.lock() {
                    v.push(Open { socket, thread });
                }
            }
            Err(e) => {
                counters.fail(format!("starting a connection thread: {e}"));
                return;
            }
        }
    }
}

struct Connection<'a> {
    stream: TcpStream,
    path: PathBuf,
    /// Created at the first send, so a connection that only logs in
    /// leaves no file.
    file: Option<File>,
    session: u64,
    port: u16,
    counters: &'a Counters,
}

impl Connection<'_> {
    fn serve(&mut self) -> Result<(), String> {
        let _ = self.stream.set_nodelay(true);
        let mut header = [0u8; HEADER_SIZE];
        let mut body = Vec::new();
        loop {
            if !read_header(&mut self.stream, &mut header)? {
                return Ok(());
            }
            let size = le_u32(&header, SIZE_AT) as usize;
            if !(HEADER_SIZE..=FRAME_SIZE_MAX_BYTES).contains(&size) {
                return Err(format!(
                    "a frame of {size} bytes (must be {HEADER_SIZE}..={FRAME_SIZE_MAX_BYTES})"
                ));
            }
            if header[COMMAND_AT] != COMMAND_REQUEST {
                return Err(format!(
                    "command {} where a request (5) was due",
                    header[COMMAND_AT]
                ));
            }
            body.resize(size - HEADER_SIZE, 0);
            self.stream
                .read_exact(&mut body)
                .map_err(|e| format!("reading a {size}-byte frame's body: {e}"))?;
            let operation = header[OPERATION_AT];
            let (status, reply_body) = match operation {
                OPERATION_SEND_MESSAGES => {
                    self.append(&header, &body)?;
                    (0, Vec::new())
                }
                OPERATION_REGISTER => (0, login_reply(self.session)),
                OPERATION_LOGOUT => (0, Vec::new()),
                OPERATION_NON_REPLICATED => match le_u32(&header, LEGACY_CODE_AT) {
                    CODE_PING => (0, Vec::new()),
                    CODE_GET_CLUSTER_METADATA => (0, cluster_metadata_reply(self.port)),
                    _ => (STATUS_FEATURE_UNAVAILABLE, Vec::new()),
                },
                _ => (STATUS_FEATURE_UNAVAILABLE, Vec::new()),
            };
            let reply = reply_header(&header, status, reply_body.len());
            self.stream
                .write_all(&reply)
                .and_then(|()| self.stream.write_all(&reply_body))
                .map_err(|e| format!("writing a reply: {e}"))?;
        }
    }

    fn append(&mut self, header: &[u8], body: &[u8]) -> Result<(), String> {
        if self.file.is_none() {
            let file = File::create(&self.path)
                .map_err(|e| format!("creating {}: {e}", self.path.display()))?;
            self.counters.files.fetch_add(1, Ordering::SeqCst);
            self.file = Some(file);
        }
        if let Some(file) = self.file.as_mut() {
            file.write_all(header)
                .and_then(|()| file.write_all(body))
                .map_err(|e| format!("appending to {}: {e}", self.path.display()))?;
        }
        self.counters.frames.fetch_add(1, Ordering::Relaxed);
        self.counters
            .bytes
            .fetch_add((header.len() + body.len()) as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Fills `header`; `false` on a clean end of stream before its first byte.
fn read_header(stream: &mut TcpStream, header: &mut [u8; HEADER_SIZE]) -> Result<bool, String> {
    let mut filled = 0;
    while filled < HEADER_SIZE {
        match stream.read(&mut header[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(format!("the stream ended {filled} bytes into a header")),
            Ok(n) => filled += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // A producer that drops its connection without a FIN.
            Err(e) if filled == 0 && e.kind() == ErrorKind::ConnectionReset => return Ok(false),
            Err(e) => return Err(format!("reading a header: {e}")),
        }
    }
    Ok(true)
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

/// The reply header to `request`: its operation, client and request echoed
/// (the operation decides how the SDK reads the body).
fn reply_header(request: &[u8; HEADER_SIZE], status: u32, body_len: usize) -> [u8; HEADER_SIZE] {
    let mut reply = [0u8; HEADER_SIZE];
    let size = (HEADER_SIZE + body_len) as u32;
    reply[SIZE_AT..SIZE_AT + 4].copy_from_slice(&size.to_le_bytes());
    reply[COMMAND_AT] = COMMAND_REPLY;
    reply[REPLY_CLIENT_AT..REPLY_CLIENT_AT + 16]
        .copy_from_slice(&request[CLIENT_AT..CLIENT_AT + 16]);
    reply[REPLY_REQUEST_AT..REPLY_REQUEST_AT + 8]
        .copy_from_slice(&request[REQUEST_AT..REQUEST_AT + 8]);
    reply[REPLY_OPERATION_AT] = request[OPERATION_AT];
    reply[REPLY_STATUS_AT..REPLY_STATUS_AT + 4].copy_from_slice(&status.to_le_bytes());
    reply
}

/// A successful login (§6): the empty result section, then user id,
/// session (non-zero), protocol version and a server version name.
fn login_reply(session: u64) -> Vec<u8> {
    let name = b"replog-bench-baseline";
    let mut body = Vec::with_capacity(21 + name.len());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&0u32.to_le_bytes());
    body.extend_from_slice(&session.to_le_bytes());
    body.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    body.push(name.len() as u8);
    body.extend_from_slice(name);
    body
}

/// One node, the leader, healthy, at `port` (§6): the SDK then stays on its
/// single-node paths.
fn cluster_metadata_reply(port: u16) -> Vec<u8> {
    let mut body = Vec::new();
    let put_text = |body: &mut Vec<u8>, text: &[u8]| {
        body.extend_from_slice(&(text.len() as u32).to_le_bytes());
        body.extend_from_slice(text);
    };
    put_text(&mut body, b"baseline");
    body.extend_from_slice(&1u32.to_le_bytes());
    put_text(&mut body, b"baseline-0");
    put_text(&mut body, b"127.0.0.1");
    body.extend_from_slice(&port.to_le_bytes());
    body.extend_from_slice(&[0u8; 6]); // quic, http, websocket ports
    body.push(0); // leader
    body.push(0); // healthy
    body
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_a_request_header_when_answered_should_echo_its_operation_client_and_request() {
        let mut request = [0u8; HEADER_SIZE];
        request[OPERATION_AT] = OPERATION_SEND_MESSAGES;
        request[CLIENT_AT..CLIENT_AT + 16].copy_from_slice(&[7; 16]);
        request[REQUEST_AT..REQUEST_AT + 8].copy_from_slice(&42u64.to_le_bytes());
        let reply = reply_header(&request, 5, 10);
        assert_eq!(le_u32(&reply, SIZE_AT), 266);
        assert_eq!(reply[COMMAND_AT], COMMAND_REPLY);
        assert_eq!(reply[REPLY_OPERATION_AT], OPERATION_SEND_MESSAGES);
        assert_eq!(&reply[REPLY_CLIENT_AT..REPLY_CLIENT_AT + 16], &[7; 16]);
        assert_eq!(le_u32(&reply, REPLY_REQUEST_AT), 42);
        assert_eq!(le_u32(&reply, REPLY_STATUS_AT), 5);
    }

    #[test]
    fn given_a_session_when_the_login_reply_is_built_should_carry_it_after_the_result_section() {
        let body = login_reply(9);
        assert_eq!(le_u32(&body, 0), 0, "result count");
        assert_eq!(u64::from_le_bytes(body[8..16].try_into().unwrap()), 9);
        assert_eq!(body[20] as usize, body.len() - 21);
    }
}
