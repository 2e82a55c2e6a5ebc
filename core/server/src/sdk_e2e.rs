//! The official `iggy` 0.11.0 SDK against [`Session`] over real loopback
//! TCP, with the in-memory test backend: the flows of client_protocol.md
//! §12.2 (low-level smoke flow, producer, stand-alone consumer, consumer
//! group), each bounded in time.
//!
//! The test server is one thread polling non-blocking sockets, so one
//! backend serves every connection without locks; it is test scaffolding,
//! not the listener (which the server wires over compio).

#![allow(clippy::unwrap_used)]

use crate::protocol::Name;
use crate::protocol::records::{ClusterMetadata, ClusterNode, MemberId, NodeRole, NodeStatus};
use crate::session::memory::MemoryBackend;
use crate::session::{Output, Session, SessionConfig};

#[path = "../tests/support/sdk_flows.rs"]
mod sdk_flows;
use iggy::prelude::*;
use sdk_flows::{bounded, connected, runtime};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

struct TestServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Conn {
    stream: TcpStream,
    session: Session,
    open: bool,
}

fn start_server() -> TestServer {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let config = Arc::new(SessionConfig {
        frame_size_max_bytes: consensus::header::FRAME_SIZE_MAX_DEFAULT,
        limits: crate::session::ClientLimits::default(),
        cluster: ClusterMetadata {
            name: "replog-test".to_owned(),
            node: ClusterNode {
                name: "replica-0".to_owned(),
                ip: "127.0.0.1".to_owned(),
                tcp_port: addr.port(),
                quic_port: 0,
                http_port: 0,
                websocket_port: 0,
                role: NodeRole::Leader,
                status: NodeStatus::Healthy,
            },
        },
        server_version: Name::new("replog-test").unwrap(),
    });
    let stop_flag = stop.clone();
    let thread = std::thread::spawn(move || {
        let mut backend = MemoryBackend::new("iggy", "iggy");
        let mut conns: Vec<Conn> = Vec::new();
        let mut next_member = 1;
        let mut buf = vec![0u8; 64 * 1024];
        while !stop_flag.load(Ordering::Relaxed) {
            let mut idle = true;
            while let Ok((stream, peer)) = listener.accept() {
                stream.set_nonblocking(true).unwrap();
                stream.set_nodelay(true).unwrap();
                let session = Session::new(config.clone(), MemberId(next_member), peer.to_string());
                next_member += 1;
                conns.push(Conn {
                    stream,
                    session,
                    open: true,
                });
                idle = false;
            }
            for c in conns.iter_mut().filter(|c| c.open) {
                match c.stream.read(&mut buf) {
                    Ok(0) => {
                        futures::executor::block_on(c.session.disconnect(&mut backend));
                        c.open = false;
                    }
                    Ok(n) => {
                        idle = false;
                        c.session.receive(&buf[..n]);
                        while let Some(out) =
                            futures::executor::block_on(c.session.next_output(&mut backend))
                        {
                            match out {
                                Output::Reply(bytes) => write_all(&mut c.stream, &bytes),
                                Output::Close(e) => panic!("the SDK sent a bad frame: {e}"),
                            }
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(_) => {
                        futures::executor::block_on(c.session.disconnect(&mut backend));
                        c.open = false;
                    }
                }
            }
            if idle {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    TestServer {
        addr,
        stop,
        thread: Some(thread),
    }
}

fn write_all(stream: &mut TcpStream, mut bytes: &[u8]) {
    while !bytes.is_empty() {
        match stream.write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::yield_now(),
            Err(_) => return,
        }
    }
}

#[test]
fn given_the_sdk_when_it_runs_the_low_level_flow_should_get_back_what_it_sent() {
    let server = start_server();
    runtime().block_on(bounded("low-level flow", async {
        let client = connected(server.addr).await;
        // Before login: ping works, a read is refused.
        client.ping().await.unwrap();
        client.login_user("iggy", "iggy").await.unwrap();
        client.ping().await.unwrap();

        sdk_flows::low_level_flow(&client).await;
        let stream_id = Identifier::named(sdk_flows::LOW_LEVEL_STREAM).unwrap();
        let topic_id = Identifier::named(sdk_flows::LOW_LEVEL_TOPIC).unwrap();
        let stream = client.get_stream(&stream_id).await.unwrap().unwrap();
        assert_eq!(stream.id, 0, "the first stream");
        let consumer = Consumer::new(Identifier::numeric(7).unwrap());
        client
            .delete_consumer_offset(&consumer, &stream_id, &topic_id, Some(1))
            .await
            .unwrap();

        let streams = client.get_streams().await.unwrap();
        assert_eq!(streams.len(), 1);
        let topics = client.get_topics(&stream_id).await.unwrap();
        assert_eq!(topics.len(), 1);
        let me = client.get_me().await.unwrap();
        assert_eq!(me.transport, "TCP");

        client.delete_topic(&stream_id, &topic_id).await.unwrap();
        client.delete_stream(&stream_id).await.unwrap();
        assert!(client.get_streams().await.unwrap().is_empty());
        client.logout_user().await.unwrap();
    }));
}

#[test]
fn given_a_wrong_password_when_logging_in_should_get_invalid_credentials() {
    let server = start_server();
    runtime().block_on(bounded("bad login", async {
        let client = connected(server.addr).await;
        let err = client.login_user("iggy", "wrong").await.unwrap_err();
        assert_eq!(
            err.as_code(),
            IggyError::InvalidCredentials.as_code(),
            "{err:?}"
        );
        // The connection stays usable: the right password then works.
        client.login_user("iggy", "iggy").await.unwrap();
        client.ping().await.unwrap();
    }));
}

#[test]
fn given_a_producer_and_a_consumer_group_when_run_should_deliver_every_message_once() {
    let server = start_server();
    runtime().block_on(bounded(
        "producer and consumer group",
        sdk_flows::producer_into_consumer_group(server.addr),
    ));
}

#[test]
fn given_key_partitioning_and_a_group_of_three_when_run_should_deliver_each_message_once_in_order()
{
    let server = start_server();
    runtime().block_on(bounded(
        "group of three",
        sdk_flows::key_partitioning_into_group_of_three(server.addr),
    ));
}

#[test]
fn given_a_standalone_consumer_when_it_auto_commits_should_resume_after_its_offset() {
    let server = start_server();
    runtime().block_on(bounded(
        "stand-alone consumer",
        sdk_flows::standalone_consumer_resumes_after_auto_commit(server.addr),
    ));
}
