//! The client listener: accepts Iggy connections and runs one
//! [`Session`] per connection over a backend.
//!
//! Each connection is its own task. It reads exactly the bytes the
//! session asks for (a compio read is not cancel-safe, so no read ever
//! sits in a select), hands them over, and writes every reply the session
//! produces before reading again — the protocol is lockstep. A frame the
//! session cannot align on closes the connection; every other connection
//! is untouched by it.
//!
//! The listener's [`ClientLimits`] bound what a connection can hold:
//! connections past `connections_max` are closed at accept; a read waits
//! at most the login timeout before a login, the idle timeout between
//! requests after it, and the I/O timeout for the rest of a started frame
//! (a timed-out read is dropped with its connection, so its cancellation
//! loses nothing); a reply must be written within the I/O timeout. A
//! failed login's answer is delayed by its source address's recent
//! failures ([`LoginThrottle`]), and the connection is closed after the
//! last one allowed. A failing accept (out of descriptors) backs off
//! instead of spinning.
//!
//! With [`ClientTls`], each accepted connection first completes a TLS
//! handshake, within the login timeout (the handshake's time counts
//! against it); the session loop then runs over the TLS stream exactly as
//! over TCP: [`connection`] is generic over the stream.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use compio::buf::BufResult;
use compio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use compio::net::{TcpListener, TcpStream};

use super::metrics::ClientMetrics;
use super::tls::ClientTls;
use crate::protocol::records::MemberId;
use crate::session::{Backend, ClientLimits, LoginEvent, Output, Session, SessionConfig};

/// The first pause after a failed accept.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
/// The longest pause after failed accepts.
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// Accepts connections until the listener fails, spawning a task per
/// connection; `backend` makes each connection's backend. With `metrics`,
/// connections are counted and each produce and poll timed, from the
/// moment its whole frame is read to its encoded reply. With `tls`, every
/// connection speaks TLS.
pub async fn serve<B, M>(
    listener: TcpListener,
    config: Arc<SessionConfig>,
    backend: Rc<M>,
    metrics: Option<ClientMetrics>,
    tls: Option<ClientTls>,
) where
    B: Backend + 'static,
    M: Fn() -> B + 'static,
{
    let mut next_member: u32 = 1;
    let open = Rc::new(Cell::new(0u32));
    let throttle = Rc::new(RefCell::new(LoginThrottle::default()));
    let mut backoff = ACCEPT_BACKOFF_MIN;
    let mut failures: u64 = 0;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => {
                backoff = ACCEPT_BACKOFF_MIN;
                accepted
            }
            Err(error) => {
                // Out of descriptors, typically: every retry would fail
                // at once until a connection closes.
                failures += 1;
                if let Some(m) = &metrics {
                    m.closed("accept_failed");
                }
                if failures == 1 || failures.is_multiple_of(100) {
                    tracing::warn!(%error, failures, pause_ms = backoff.as_millis() as u64, "accepting a client connection failed; pausing");
                }
                compio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
                continue;
            }
        };
        if open.get() >= config.limits.connections_max {
            if let Some(m) = &metrics {
                m.closed("connections_max");
            }
            tracing::debug!(%peer, limit = config.limits.connections_max, "client connections full; connection closed");
            drop(stream);
            continue;
        }
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %error, "TCP_NODELAY not set");
        }
        let connected_at = Instant::now();
        let member = MemberId(next_member);
        next_member = next_member.wrapping_add(1).max(1);
        let session = Session::new(Arc::clone(&config), member, peer.to_string());
        let backend = Rc::clone(&backend);
        let slot = OpenSlot::take(&open);
        let throttle = Rc::clone(&throttle);
        let metrics = metrics.clone();
        let tls = tls.clone();
        compio::runtime::spawn(async move {
            let link = Link {
                peer,
                connected_at,
                metrics,
            };
            match tls {
                None => connection(stream, link, session, backend(), &throttle).await,
                Some(tls) => {
                    let login_timeout = session.limits().login_timeout;
                    if let Some(stream) = handshake(&tls, stream, &link, login_timeout).await {
                        connection(stream, link, session, backend(), &throttle).await;
                    }
                }
            }
            drop(slot);
        })
        .detach();
    }
}

/// One open connection, counted until dropped.
struct OpenSlot(Rc<Cell<u32>>);

impl OpenSlot {
    fn take(open: &Rc<Cell<u32>>) -> Self {
        open.set(open.get().saturating_add(1));
        Self(Rc::clone(open))
    }
}

impl Drop for OpenSlot {
    fn drop(&mut self) {
        self.0.set(self.0.get().saturating_sub(1));
    }
}

/// Recent failed logins per source address: each failure doubles the
/// delay before the next failed login from that address is answered, up
/// to a ceiling; a success or a quiet spell forgives them. Bounded: past
/// [`LoginThrottle::ADDRESSES_MAX`] addresses the quiet ones are dropped
/// first, then the map is cleared (an attacker cycling addresses gets the
/// first delay again, never an unbounded map).
#[derive(Debug, Default)]
pub struct LoginThrottle {
    failures: HashMap<IpAddr, (u32, Instant)>,
}

impl LoginThrottle {
    /// The first failure's delay.
    pub const DELAY_MIN: Duration = Duration::from_millis(100);
    /// The longest delay.
    pub const DELAY_MAX: Duration = Duration::from_secs(5);
    /// A failure older than this is forgotten.
    pub const FORGET_AFTER: Duration = Duration::from_secs(600);
    /// Addresses remembered at most.
    pub const ADDRESSES_MAX: usize = 10_000;

    /// Records a failure from `ip` at `now`; the delay before answering it.
    pub fn failed(&mut self, ip: IpAddr, now: Instant) -> Duration {
        if self.failures.len() >= Self::ADDRESSES_MAX && !self.failures.contains_key(&ip) {
            self.failures
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < Self::FORGET_AFTER);
            if self.failures.len() >= Self::ADDRESSES_MAX {
                self.failures.clear();
            }
        }
        let entry = self.failures.entry(ip).or_insert((0, now));
        if now.saturating_duration_since(entry.1) >= Self::FORGET_AFTER {
            entry.0 = 0;
        }
        entry.0 = entry.0.saturating_add(1);
        entry.1 = now;
        let doublings = entry.0.saturating_sub(1).min(16);
        Self::DELAY_MIN
            .saturating_mul(1u32 << doublings)
            .min(Self::DELAY_MAX)
    }

    /// A login from `ip` succeeded.
    pub fn forgive(&mut self, ip: IpAddr) {
        self.failures.remove(&ip);
    }
}

/// Why a connection was closed by a limit (the metric's reason).
enum Expired {
    Login,
    Idle,
    Io,
}

impl Expired {
    fn reason(&self) -> &'static str {
        match self {
            Self::Login => "login_timeout",
            Self::Idle => "idle_timeout",
            Self::Io => "io_timeout",
        }
    }
}

/// `future` within `limit` (none: without a limit).
async fn within<T>(limit: Option<Duration>, future: impl Future<Output = T>) -> Option<T> {
    match limit {
        Some(limit) => compio::time::timeout(limit, future).await.ok(),
        None => Some(future.await),
    }
}

/// How long the next read may wait, and what it is called when it expires.
fn read_limit(
    session: &Session,
    limits: &ClientLimits,
    connected_at: Instant,
) -> (Option<Duration>, Expired) {
    if session.buffered() > 0 {
        (Some(limits.io_timeout), Expired::Io)
    } else if session.is_logged_in() {
        (limits.idle_timeout, Expired::Idle)
    } else {
        let left = limits.login_timeout.saturating_sub(connected_at.elapsed());
        (Some(left), Expired::Login)
    }
}

/// What a connection task knows of its connection besides the stream.
struct Link {
    peer: SocketAddr,
    /// When it was accepted: the login timeout runs from here, so a TLS
    /// handshake's time counts against it.
    connected_at: Instant,
    metrics: Option<ClientMetrics>,
}

/// The TLS handshake of an accepted connection, within what is left of
/// the login timeout; `None` (counted as `tls_handshake`) when it failed
/// or did not finish in time. Dropping the timed-out handshake drops its
/// socket, so its cancellation loses nothing.
async fn handshake(
    tls: &ClientTls,
    stream: TcpStream,
    link: &Link,
    login_timeout: Duration,
) -> Option<compio_tls::TlsStream<TcpStream>> {
    let left = login_timeout.saturating_sub(link.connected_at.elapsed());
    let outcome = within(Some(left), tls.acceptor().accept(stream)).await;
    let peer = link.peer;
    let error = match outcome {
        Some(Ok(stream)) => return Some(stream),
        Some(Err(error)) => error.to_string(),
        None => "not finished within the login timeout".to_owned(),
    };
    if let Some(m) = &link.metrics {
        m.closed("tls_handshake");
    }
    tracing::debug!(%peer, %error, "client TLS handshake failed; connection closed");
    None
}

/// Serves one connection's session over `stream` (TCP, or TLS after its
/// handshake) until either end closes it.
async fn connection<S, B>(
    mut stream: S,
    link: Link,
    mut session: Session,
    mut backend: B,
    throttle: &RefCell<LoginThrottle>,
) where
    S: AsyncRead + AsyncWrite,
    B: Backend,
{
    let Link {
        peer,
        connected_at,
        metrics,
    } = link;
    let _open = metrics.as_ref().map(ClientMetrics::connected);
    let limits = session.limits();
    let closed_by = |reason: &'static str| {
        if let Some(m) = &metrics {
            m.closed(reason);
        }
        tracing::debug!(%peer, reason, "client connection closed by a limit");
    };
    tracing::debug!(%peer, "client connected");
    'connection: loop {
        let wanted = session.wanted().max(1);
        let (limit, expired) = read_limit(&session, &limits, connected_at);
        let Some(BufResult(read, buf)) =
            within(limit, stream.read_exact(Vec::with_capacity(wanted))).await
        else {
            closed_by(expired.reason());
            break;
        };
        match read {
            Ok(()) => session.receive(&buf),
            Err(error) => {
                if error.kind() != std::io::ErrorKind::UnexpectedEof {
                    tracing::debug!(%peer, %error, "client read failed");
                } else if let Err(e) = session.end_of_stream() {
                    tracing::debug!(%peer, error = %e, "client left mid-frame");
                }
                break;
            }
        }
        let mut started = Instant::now();
        while let Some(output) = session.next_output(&mut backend).await {
            if let (Some(metrics), Some(command)) = (&metrics, session.take_handled()) {
                metrics.observe(command, started.elapsed());
            }
            match output {
                Output::Reply(bytes) => {
                    let mut close_after = false;
                    match session.take_login_event() {
                        Some(LoginEvent::Succeeded) => throttle.borrow_mut().forgive(peer.ip()),
                        Some(LoginEvent::Failed { last }) => {
                            let delay = throttle.borrow_mut().failed(peer.ip(), Instant::now());
                            compio::time::sleep(delay).await;
                            close_after = last;
                        }
                        None => {}
                    }
                    // The flush matters over TLS: the TLS stream buffers
                    // records until flushed (over TCP it does nothing).
                    let write = async {
                        let BufResult(written, _) = stream.write_all(bytes).await;
                        written?;
                        stream.flush().await
                    };
                    let Some(written) = within(Some(limits.io_timeout), write).await else {
                        closed_by(Expired::Io.reason());
                        break 'connection;
                    };
                    if let Err(error) = written {
                        tracing::debug!(%peer, %error, "client write failed");
                        break 'connection;
                    }
                    if close_after {
                        closed_by("login_failures");
                        break 'connection;
                    }
                    started = Instant::now();
                }
                Output::Close(error) => {
                    tracing::info!(%peer, %error, "closing a client connection out of frame");
                    break 'connection;
                }
            }
        }
    }
    session.disconnect(&mut backend).await;
    tracing::debug!(%peer, "client disconnected");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_failed_logins_from_one_address_should_double_the_delay_to_the_ceiling_and_forgive_on_success()
     {
        let mut t = LoginThrottle::default();
        let ip: IpAddr = [10, 0, 0, 1].into();
        let other: IpAddr = [10, 0, 0, 2].into();
        let now = Instant::now();
        let delays: Vec<Duration> = (0..8).map(|_| t.failed(ip, now)).collect();
        assert_eq!(delays[0], LoginThrottle::DELAY_MIN);
        assert_eq!(delays[1], LoginThrottle::DELAY_MIN * 2);
        assert_eq!(delays[2], LoginThrottle::DELAY_MIN * 4);
        assert_eq!(
            *delays.last().unwrap_or(&Duration::ZERO),
            LoginThrottle::DELAY_MAX
        );
        assert_eq!(
            t.failed(other, now),
            LoginThrottle::DELAY_MIN,
            "per address"
        );
        t.forgive(ip);
        assert_eq!(t.failed(ip, now), LoginThrottle::DELAY_MIN);
        let later = now + LoginThrottle::FORGET_AFTER;
        assert_eq!(
            t.failed(other, later),
            LoginThrottle::DELAY_MIN,
            "a quiet spell forgives"
        );
    }

    #[test]
    fn given_more_addresses_than_the_ceiling_should_stay_bounded() {
        let mut t = LoginThrottle::default();
        let now = Instant::now();
        for i in 0..(LoginThrottle::ADDRESSES_MAX as u32 + 10) {
            t.failed(IpAddr::from(i.to_be_bytes()), now);
        }
        assert!(t.failures.len() <= LoginThrottle::ADDRESSES_MAX);
    }
}
