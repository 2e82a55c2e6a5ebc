//! The client listener: accepts Iggy connections and runs one
//! [`Session`] per connection over a backend.
//!
//! Each connection is its own task. It reads exactly the bytes the
//! session asks for (a compio read is not cancel-safe, so no read ever
//! sits in a select), hands them over, and writes every reply the session
//! produces before reading again — the protocol is lockstep. A frame the
//! session cannot align on closes the connection; every other connection
//! is untouched by it.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use compio::buf::BufResult;
use compio::io::{AsyncReadExt, AsyncWriteExt};
use compio::net::{TcpListener, TcpStream};

use super::metrics::ClientMetrics;
use crate::protocol::records::MemberId;
use crate::session::{Backend, Output, Session, SessionConfig};

/// Accepts connections until the listener fails, spawning a task per
/// connection; `backend` makes each connection's backend. With `metrics`,
/// connections are counted and each produce and poll timed, from the
/// moment its whole frame is read to its encoded reply.
pub async fn serve<B, M>(
    listener: TcpListener,
    config: Arc<SessionConfig>,
    backend: Rc<M>,
    metrics: Option<ClientMetrics>,
) where
    B: Backend + 'static,
    M: Fn() -> B + 'static,
{
    let mut next_member: u32 = 1;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                continue;
            }
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%peer, %error, "TCP_NODELAY not set");
        }
        let member = MemberId(next_member);
        next_member = next_member.wrapping_add(1).max(1);
        let session = Session::new(Arc::clone(&config), member, peer.to_string());
        let backend = backend();
        compio::runtime::spawn(connection(stream, peer, session, backend, metrics.clone()))
            .detach();
    }
}

async fn connection<B: Backend>(
    mut stream: TcpStream,
    peer: SocketAddr,
    mut session: Session,
    mut backend: B,
    metrics: Option<ClientMetrics>,
) {
    let _open = metrics.as_ref().map(ClientMetrics::connected);
    tracing::debug!(%peer, "client connected");
    loop {
        let wanted = session.wanted().max(1);
        let BufResult(read, buf) = stream.read_exact(Vec::with_capacity(wanted)).await;
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
        let mut close = false;
        let mut started = Instant::now();
        while let Some(output) = session.next_output(&mut backend).await {
            if let (Some(metrics), Some(command)) = (&metrics, session.take_handled()) {
                metrics.observe(command, started.elapsed());
            }
            match output {
                Output::Reply(bytes) => {
                    let BufResult(written, _) = stream.write_all(bytes).await;
                    if let Err(error) = written {
                        tracing::debug!(%peer, %error, "client write failed");
                        close = true;
                        break;
                    }
                    started = Instant::now();
                }
                Output::Close(error) => {
                    tracing::info!(%peer, %error, "closing a client connection out of frame");
                    close = true;
                    break;
                }
            }
        }
        if close {
            break;
        }
    }
    session.disconnect(&mut backend).await;
    tracing::debug!(%peer, "client disconnected");
}
