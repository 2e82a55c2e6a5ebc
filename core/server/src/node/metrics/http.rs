//! The metrics endpoint's HTTP side: a small HTTP/1.1 responder on its
//! own OS thread, answering `GET /metrics` and nothing else.
//!
//! Hand-written rather than hyper on tokio: the server runs compio, and
//! one scrape every few seconds needs none of a general HTTP stack — a
//! second async runtime (and tokio in the server's dependencies) would
//! cost more than these few hundred lines. It is hostile-input safe by
//! construction: the request head is read into a fixed ceiling
//! ([`HttpLimits::head_max_bytes`]) under a per-read timeout and a whole-
//! request deadline, so a slow or endless client holds one connection
//! slot for a bounded time; at most [`HttpLimits::connections_max`]
//! connections are served at once (the rest are answered 503 without
//! reading and closed); every connection carries one request and closes
//! (`Connection: close`), so there is no keep-alive state to get wrong.
//! Nothing here panics on input: parsing is over byte slices with
//! checked splits.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The OpenMetrics text exposition's content type (what
/// `prometheus_client::encoding::text` writes; Prometheus asks for it).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The path served.
pub const METRICS_PATH: &str = "/metrics";

/// Bounds on what one connection may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// The most bytes of request head (request line and headers) read; a
    /// longer head is answered 431.
    pub head_max_bytes: usize,
    /// The longest one read may wait.
    pub read_timeout: Duration,
    /// The longest the whole request head may take to arrive.
    pub request_deadline: Duration,
    /// The longest one write of the response may wait.
    pub write_timeout: Duration,
    /// Connections served at once.
    pub connections_max: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            head_max_bytes: 8 * 1024,
            read_timeout: Duration::from_secs(2),
            request_deadline: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            connections_max: 4,
        }
    }
}

/// What a scrape renders: the exposition text.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A response, before it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Extra headers (name, value).
    pub headers: Vec<(&'static str, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    fn text(status: u16, body: &str) -> Self {
        Self {
            status,
            headers: vec![("Content-Type", "text/plain; charset=utf-8".to_owned())],
            body: body.as_bytes().to_vec(),
        }
    }

    /// The bytes on the wire.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut head = format!("HTTP/1.1 {} {}\r\n", self.status, reason(self.status));
        for (name, value) in &self.headers {
            head.push_str(name);
            head.push_str(": ");
            head.push_str(value);
            head.push_str("\r\n");
        }
        head.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            self.body.len()
        ));
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

/// Why a request head could not be read whole.
#[derive(Debug, PartialEq, Eq)]
pub enum HeadError {
    /// More than the ceiling arrived without the blank line ending it.
    TooLarge,
    /// The client was too slow (a read timed out or the deadline passed).
    TimedOut,
    /// The client closed before the head was complete.
    Closed,
    /// Another socket error.
    Io(ErrorKind),
}

/// Reads a request head (through the blank line) within the limits.
///
/// # Errors
/// [`HeadError`]; the connection is then answered (too large: 431; too
/// slow: 408) or just closed.
pub fn read_head(stream: &mut impl Read, limits: &HttpLimits) -> Result<Vec<u8>, HeadError> {
    let started = Instant::now();
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if started.elapsed() > limits.request_deadline {
            return Err(HeadError::TimedOut);
        }
        let room = limits.head_max_bytes.saturating_sub(head.len());
        if room == 0 {
            return Err(HeadError::TooLarge);
        }
        let take = room.min(chunk.len());
        let n = match stream.read(&mut chunk[..take]) {
            Ok(0) => return Err(HeadError::Closed),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(HeadError::TimedOut);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(HeadError::Io(e.kind())),
        };
        let scan_from = head.len().saturating_sub(3);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&head, scan_from) {
            head.truncate(end);
            return Ok(head);
        }
    }
}

/// Where the head ends (just past its blank line), searching from `from`.
fn head_end(bytes: &[u8], from: usize) -> Option<usize> {
    let tail = bytes.get(from..)?;
    if let Some(i) = tail.windows(4).position(|w| w == b"\r\n\r\n") {
        return Some(from + i + 4);
    }
    // Bare-LF heads are tolerated (RFC 9112 §2.2).
    tail.windows(2)
        .position(|w| w == b"\n\n")
        .map(|i| from + i + 2)
}

/// Answers one request head: `GET /metrics` (a query string ignored) with
/// the rendered exposition, anything else with its error status.
pub fn respond(head: &[u8], render: &dyn Fn() -> String) -> Response {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let line = head.get(..line_end).unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let Ok(line) = std::str::from_utf8(line) else {
        return Response::text(400, "bad request line\n");
    };
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Response::text(400, "bad request line\n");
    };
    if method.is_empty() || target.is_empty() {
        return Response::text(400, "bad request line\n");
    }
    if version != "HTTP/1.1" && version != "HTTP/1.0" {
        return Response::text(505, "HTTP/1.0 or HTTP/1.1 only\n");
    }
    let path = target.split('?').next().unwrap_or(target);
    if path != METRICS_PATH {
        return Response::text(404, "only /metrics is served here\n");
    }
    if method != "GET" {
        let mut response = Response::text(405, "GET only\n");
        response.headers.push(("Allow", "GET".to_owned()));
        return response;
    }
    Response {
        status: 200,
        headers: vec![("Content-Type", CONTENT_TYPE.to_owned())],
        body: render().into_bytes(),
    }
}

/// The responder's thread, stopped by [`HttpServer::stop`].
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Serves `listener` on a thread of its own.
    ///
    /// # Errors
    /// A sentence when the listener cannot be polled or the thread started.
    pub fn start(
        listener: TcpListener,
        limits: HttpLimits,
        render: Render,
    ) -> Result<Self, String> {
        let addr = listener
            .local_addr()
            .map_err(|e| format!("reading the metrics listener's address: {e}"))?;
        // Polled (as the replica bus's acceptor is), so a stop needs no
        // wake-up connection.
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("polling the metrics listener on {addr}: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("metrics-http".into())
            .spawn(move || accept_loop(&listener, limits, &render, &stopping))
            .map_err(|e| format!("starting the metrics thread: {e}"))?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and waits for the thread (connections being served
    /// finish on their own threads, within their limits).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Counts a connection slot; gives it back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

fn accept_loop(listener: &TcpListener, limits: HttpLimits, render: &Render, stop: &AtomicBool) {
    let active = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        let (stream, peer) = match listener.accept() {
            Ok(accepted) => accepted,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(error) => {
                tracing::debug!(%error, "metrics accept failed");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::AcqRel) >= limits.connections_max {
            active.fetch_sub(1, Ordering::AcqRel);
            refuse_busy(stream);
            continue;
        }
        let slot = Slot(Arc::clone(&active));
        let render = Arc::clone(render);
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                let _slot = slot;
                serve_connection(stream, &limits, &*render);
            });
        if let Err(error) = spawned {
            tracing::warn!(%peer, %error, "no thread for a metrics connection");
        }
    }
}

/// Past the connection cap: a 503 written without waiting, then closed.
fn refuse_busy(mut stream: TcpStream) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = stream.write_all(&Response::text(503, "busy\n").to_bytes());
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Reads one request and answers it.
pub fn serve_connection(mut stream: TcpStream, limits: &HttpLimits, render: &dyn Fn() -> String) {
    let prepared = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(limits.read_timeout)))
        .and_then(|()| stream.set_write_timeout(Some(limits.write_timeout)));
    if prepared.is_err() {
        return;
    }
    let response = match read_head(&mut stream, limits) {
        Ok(head) => respond(&head, render),
        Err(HeadError::TooLarge) => Response::text(431, "request head too large\n"),
        Err(HeadError::TimedOut) => Response::text(408, "request too slow\n"),
        Err(HeadError::Closed | HeadError::Io(_)) => return,
    };
    let _ = stream.write_all(&response.to_bytes());
    let _ = stream.flush();
    close_after_answer(stream, limits);
}

/// The most unread request bytes drained before a close.
const DRAIN_MAX_BYTES: usize = 4 << 20;

/// Ends the write side, then reads and discards what the client still
/// sends (bounded in bytes and by the read timeout): closing a socket
/// with unread input makes the kernel reset it, and a reset can discard
/// the answer before the client reads it (a 431 to an oversized head).
fn close_after_answer(mut stream: TcpStream, limits: &HttpLimits) {
    let _ = stream.shutdown(Shutdown::Write);
    let started = Instant::now();
    let mut sink = [0u8; 4096];
    let mut drained = 0usize;
    while drained < DRAIN_MAX_BYTES && started.elapsed() < limits.request_deadline {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn render() -> String {
        "# EOF\n".to_owned()
    }

    fn status_of(head: &[u8]) -> u16 {
        respond(head, &render).status
    }

    #[test]
    fn given_get_metrics_when_answered_should_serve_the_exposition() {
        let r = respond(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", &render);
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"# EOF\n");
        let wire = String::from_utf8(r.to_bytes()).unwrap();
        assert!(wire.starts_with("HTTP/1.1 200 OK\r\n"), "{wire}");
        assert!(wire.contains(&format!("Content-Type: {CONTENT_TYPE}\r\n")));
        assert!(wire.contains("Content-Length: 6\r\n"));
        assert!(wire.ends_with("\r\n\r\n# EOF\n"));
        assert_eq!(status_of(b"GET /metrics?x=1 HTTP/1.0\n\n"), 200);
    }

    #[test]
    fn given_other_requests_when_answered_should_refuse_each_with_its_status() {
        assert_eq!(status_of(b"GET / HTTP/1.1\r\n\r\n"), 404);
        assert_eq!(status_of(b"GET /metricsx HTTP/1.1\r\n\r\n"), 404);
        assert_eq!(status_of(b"POST /metrics HTTP/1.1\r\n\r\n"), 405);
        assert_eq!(status_of(b"GET /metrics HTTP/2.0\r\n\r\n"), 505);
        for bad in [
            &b""[..],
            b"\r\n\r\n",
            b"GET\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/1.1 extra\r\n\r\n",
            b"\xff\xfe /metrics HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(status_of(bad), 400, "{bad:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn given_any_bytes_when_answered_should_never_panic(head in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let r = respond(&head, &render);
            proptest::prop_assert!([200, 400, 404, 405, 505].contains(&r.status));
        }
    }

    #[test]
    fn given_a_head_past_the_ceiling_when_read_should_stop_at_the_ceiling() {
        let limits = HttpLimits {
            head_max_bytes: 64,
            ..HttpLimits::default()
        };
        let endless = std::io::repeat(b'a');
        assert_eq!(
            read_head(&mut endless.take(1 << 20), &limits),
            Err(HeadError::TooLarge)
        );
        let mut cut = &b"GET /metrics HTTP/1.1\r\n"[..];
        assert_eq!(read_head(&mut cut, &limits), Err(HeadError::Closed));
        let mut whole = &b"GET /metrics HTTP/1.1\r\n\r\nbody"[..];
        assert_eq!(
            read_head(&mut whole, &limits).unwrap(),
            b"GET /metrics HTTP/1.1\r\n\r\n"
        );
    }

    fn start(limits: HttpLimits) -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        HttpServer::start(listener, limits, Arc::new(render)).unwrap()
    }

    /// Sends `request` and reads the whole answer (the server closes).
    fn exchange(addr: SocketAddr, request: &[u8]) -> String {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let _ = stream.write_all(request);
        let mut answer = Vec::new();
        let _ = stream.read_to_end(&mut answer);
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[test]
    fn given_a_real_socket_when_hostile_clients_connect_should_answer_bounded_and_keep_serving() {
        let limits = HttpLimits {
            head_max_bytes: 1024,
            read_timeout: Duration::from_millis(300),
            request_deadline: Duration::from_millis(600),
            connections_max: 2,
            ..HttpLimits::default()
        };
        let server = start(limits);
        let addr = server.addr();
        // Garbage, a huge request line, a wrong path.
        assert!(exchange(addr, b"\x00\x01garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        let huge = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(1 << 20));
        assert!(exchange(addr, huge.as_bytes()).starts_with("HTTP/1.1 431"));
        assert!(exchange(addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        // A slow client: one byte, then nothing; answered 408 within the
        // deadline, not held for ever.
        let started = Instant::now();
        let slow = exchange(addr, b"G");
        assert!(slow.starts_with("HTTP/1.1 408"), "{slow}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // Two silent clients fill the cap: a third is refused at once,
        // and once they time out a scrape is served again.
        let hold: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(addr).unwrap()).collect();
        std::thread::sleep(Duration::from_millis(100));
        assert!(exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503"));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let answer = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
            if answer.starts_with("HTTP/1.1 200") {
                assert!(answer.ends_with("# EOF\n"));
                break;
            }
            assert!(Instant::now() < deadline, "never served again: {answer}");
            std::thread::sleep(Duration::from_millis(50));
        }
        drop(hold);
        server.stop();
    }
}
