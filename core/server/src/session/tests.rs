//! Session tests: SDK-shaped frames in, replies read back with the SDK's
//! reply-splitting rules, over the in-memory backend.

#![allow(clippy::unwrap_used)]

use super::memory::MemoryBackend;
use super::*;
use crate::protocol::records::{ClusterNode, NodeRole, NodeStatus};
use crate::protocol::tests::{sdk_frame, sdk_reply};
use iggy_binary_protocol::WireEncode;
use iggy_binary_protocol::requests::consumer_groups::{
    CreateConsumerGroupRequest, JoinConsumerGroupRequest, SyncConsumerGroupRequest,
};
use iggy_binary_protocol::requests::streams::{CreateStreamRequest, GetStreamRequest};
use iggy_binary_protocol::requests::topics::CreateTopicRequest;
use iggy_binary_protocol::requests::users::LoginRegisterRequest;
use iggy_binary_protocol::{ClientVersionInfo, WireIdentifier, WireName, WireOptions};

fn config() -> Arc<SessionConfig> {
    Arc::new(SessionConfig {
        frame_size_max_bytes: 1 << 20,
        limits: ClientLimits::default(),
        cluster: ClusterMetadata {
            name: "c".to_owned(),
            node: ClusterNode {
                name: "r0".to_owned(),
                ip: "127.0.0.1".to_owned(),
                tcp_port: 8090,
                quic_port: 0,
                http_port: 0,
                websocket_port: 0,
                role: NodeRole::Leader,
                status: NodeStatus::Healthy,
            },
        },
        server_version: Name::new("replog").unwrap(),
    })
}

struct Harness {
    session: Session,
    backend: MemoryBackend,
    session_number: u64,
    request: u64,
}

impl Harness {
    fn new() -> Self {
        Self {
            session: Session::new(config(), MemberId(1), "127.0.0.1:1"),
            backend: MemoryBackend::new("iggy", "iggy"),
            session_number: 0,
            request: 0,
        }
    }

    /// Sends one request the way the SDK would and returns the raw reply.
    fn send(&mut self, code: u32, payload: &[u8]) -> Vec<u8> {
        self.request += 1;
        let frame = sdk_frame(code, payload, self.session_number, self.request);
        self.session.receive(&frame);
        let out = futures::executor::block_on(self.session.next_output(&mut self.backend));
        match out {
            Some(Output::Reply(bytes)) => bytes,
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn call(&mut self, code: u32, payload: &[u8]) -> Result<Vec<u8>, u32> {
        sdk_reply(&self.send(code, payload))
    }

    fn login(&mut self, password: &str) -> Vec<u8> {
        let body = LoginRegisterRequest {
            version_info: ClientVersionInfo {
                protocol_version: iggy_binary_protocol::IGGY_PROTOCOL_VERSION,
                sdk_name: WireName::new("rust-sdk").unwrap(),
                sdk_version: WireName::new("0.11.0").unwrap(),
            },
            username: WireName::new("iggy").unwrap(),
            password: secrecy::SecretString::from(password.to_owned()),
            client_context: None,
        }
        .to_bytes();
        let reply = self.send(40, &body);
        if reply[60] == 8 {
            let body = sdk_reply(&reply).unwrap();
            self.session_number = u64::from_le_bytes(body[4..12].try_into().unwrap());
        }
        reply
    }
}

fn create_stream(name: &str) -> Vec<u8> {
    CreateStreamRequest {
        name: WireName::new(name).unwrap(),
        options: WireOptions::empty(),
    }
    .to_bytes()
    .to_vec()
}

#[test]
fn given_no_login_when_asked_should_serve_only_ping_and_cluster_metadata() {
    let mut h = Harness::new();
    assert_eq!(h.call(1, &[]), Ok(vec![]));
    let meta = h.call(12, &[]).unwrap();
    assert_eq!(meta, config().cluster.to_bytes());
    assert_eq!(h.call(201, &[]), Err(40));
    assert_eq!(h.call(20, &[]), Err(40));
    assert_eq!(
        h.call(
            200,
            &GetStreamRequest {
                stream_id: WireIdentifier::numeric(0)
            }
            .to_bytes()
        ),
        Err(40)
    );
    // A replicated op with a made-up session, and an unimplemented one.
    h.session_number = 5;
    assert_eq!(h.call(202, &create_stream("s")), Err(40));
    assert_eq!(h.call(10, &[]), Err(40));
    assert!(!h.session.is_logged_in());
}

#[test]
fn given_a_wrong_password_when_logging_in_should_evict_with_reason_9_and_stay_open() {
    let mut h = Harness::new();
    let reply = h.login("nope");
    assert_eq!((reply.len(), reply[60], reply[255]), (256, 13, 9));
    assert!(!h.session.is_logged_in());
    let reply = h.login("iggy");
    assert_eq!(reply[60], 8);
    assert!(h.session.is_logged_in());
    assert_eq!(h.session_number, 1, "the first session is 1, never 0");
}

#[test]
fn given_a_malformed_or_incompatible_login_when_sent_should_evict_with_its_reason() {
    let mut h = Harness::new();
    let reply = h.send(40, b"\x00\x2c\x00\x00\x08rust");
    assert_eq!((reply[60], reply[255]), (13, 15));
    let mut body = crate::protocol::pack_version(0, 12, 0)
        .to_le_bytes()
        .to_vec();
    for s in ["rust-sdk", "0.12.0", "iggy"] {
        body.push(s.len() as u8);
        body.extend_from_slice(s.as_bytes());
    }
    body.extend_from_slice(b"\x04iggy\x00\x00\x00\x00");
    let reply = h.send(40, &body);
    assert_eq!((reply[60], reply[255]), (13, 14));
    assert_eq!(
        &reply[144..148],
        &crate::protocol::PROTOCOL_VERSION.to_le_bytes()
    );
    assert!(!h.session.is_logged_in());
}

#[test]
fn given_a_login_when_streams_are_created_and_read_should_answer_like_the_sdk_expects() {
    let mut h = Harness::new();
    h.login("iggy");
    let get = GetStreamRequest {
        stream_id: WireIdentifier::named("s").unwrap(),
    }
    .to_bytes();
    // Missing: status 0, empty body.
    assert_eq!(h.call(200, &get), Ok(vec![]));
    let created = h.call(202, &create_stream("s")).unwrap();
    assert!(!created.is_empty(), "create returns the details");
    assert_eq!(h.call(200, &get).unwrap(), created);
    // A duplicate comes back in the result section.
    assert_eq!(h.call(202, &create_stream("s")), Err(1012));
    // A topic with 0 partitions is refused by the backend.
    let topic = CreateTopicRequest {
        stream_id: WireIdentifier::numeric(0),
        partitions_count: 0,
        name: WireName::new("t").unwrap(),
        options: WireOptions::empty(),
    }
    .to_bytes();
    assert_eq!(h.call(302, &topic), Err(2019));
    // Unknown and unimplemented codes.
    assert_eq!(h.call(9999, &[]), Err(3));
    assert_eq!(h.call(10, &[]), Err(5));
    // A malformed body.
    assert_eq!(h.call(200, b"\x01\x03abc"), Err(6));
}

#[test]
fn given_a_replicated_request_with_another_session_when_logged_in_should_refuse_it() {
    let mut h = Harness::new();
    h.login("iggy");
    let mine = h.session_number;
    h.session_number = mine + 1;
    assert_eq!(h.call(202, &create_stream("s")), Err(40));
    // Non-replicated requests may carry session 0.
    h.session_number = 0;
    assert_eq!(h.call(201, &[]), Ok(vec![]));
    h.session_number = mine;
    assert!(h.call(202, &create_stream("s")).is_ok());
}

#[test]
fn given_a_logout_when_done_should_gate_again() {
    let mut h = Harness::new();
    h.login("iggy");
    assert_eq!(h.call(201, &[]), Ok(vec![]));
    assert_eq!(h.call(39, &[]), Ok(vec![]));
    assert!(!h.session.is_logged_in());
    assert_eq!(h.call(201, &[]), Err(40));
}

#[test]
fn given_a_joined_group_when_the_connection_goes_should_leave_it() {
    let mut h = Harness::new();
    h.login("iggy");
    h.call(202, &create_stream("s")).unwrap();
    let topic = CreateTopicRequest {
        stream_id: WireIdentifier::numeric(0),
        partitions_count: 3,
        name: WireName::new("t").unwrap(),
        options: WireOptions::empty(),
    }
    .to_bytes();
    h.call(302, &topic).unwrap();
    let group = CreateConsumerGroupRequest {
        stream_id: WireIdentifier::numeric(0),
        topic_id: WireIdentifier::numeric(0),
        name: WireName::new("g").unwrap(),
    }
    .to_bytes();
    h.call(602, &group).unwrap();
    let ids = || JoinConsumerGroupRequest {
        stream_id: WireIdentifier::numeric(0),
        topic_id: WireIdentifier::numeric(0),
        group_id: WireIdentifier::named("g").unwrap(),
    };
    let sync = SyncConsumerGroupRequest {
        stream_id: WireIdentifier::numeric(0),
        topic_id: WireIdentifier::numeric(0),
        group_id: WireIdentifier::named("g").unwrap(),
    }
    .to_bytes();
    // Not a member: empty body.
    assert_eq!(h.call(606, &sync), Ok(vec![]));
    assert_eq!(h.call(604, &ids().to_bytes()), Ok(vec![]));
    let assigned = h.call(606, &sync).unwrap();
    assert_eq!(u32::from_le_bytes(assigned[8..12].try_into().unwrap()), 3);
    assert_eq!(h.session.joined_groups().count(), 1);
    let me = h.call(20, &[]).unwrap();
    assert_eq!(
        u32::from_le_bytes(me[me.len() - 16..me.len() - 12].try_into().unwrap()),
        1
    );

    futures::executor::block_on(h.session.disconnect(&mut h.backend));
    assert_eq!(h.session.joined_groups().count(), 0);
    assert!(!h.session.is_logged_in());
    // Another connection sees the group without members.
    let mut other = Harness {
        session: Session::new(config(), MemberId(2), "127.0.0.1:2"),
        backend: h.backend,
        session_number: 0,
        request: 0,
    };
    other.login("iggy");
    let details = other
        .call(
            600,
            &iggy_binary_protocol::requests::consumer_groups::GetConsumerGroupRequest {
                stream_id: WireIdentifier::numeric(0),
                topic_id: WireIdentifier::numeric(0),
                group_id: WireIdentifier::named("g").unwrap(),
            }
            .to_bytes(),
        )
        .unwrap();
    assert_eq!(
        u32::from_le_bytes(details[8..12].try_into().unwrap()),
        0,
        "members_count"
    );
}

#[test]
fn given_two_frames_at_once_when_served_should_answer_both_in_order() {
    let mut h = Harness::new();
    let mut bytes = sdk_frame(1, &[], 0, 0);
    bytes.extend(sdk_frame(201, &[], 0, 0));
    h.session.receive(&bytes);
    let a = futures::executor::block_on(h.session.next_output(&mut h.backend));
    let b = futures::executor::block_on(h.session.next_output(&mut h.backend));
    let c = futures::executor::block_on(h.session.next_output(&mut h.backend));
    let (Some(Output::Reply(a)), Some(Output::Reply(b)), None) = (a, b, c) else {
        panic!("expected two replies");
    };
    assert_eq!(sdk_reply(&a), Ok(vec![]));
    assert_eq!(sdk_reply(&b), Err(40));
}

#[test]
fn given_garbage_when_received_should_close_once_and_then_stay_silent() {
    let mut h = Harness::new();
    h.session.receive(&[0xff; 300]);
    let out = futures::executor::block_on(h.session.next_output(&mut h.backend));
    assert!(matches!(
        out,
        Some(Output::Close(FrameError::SizeAboveMax { .. }))
    ));
    h.session.receive(&sdk_frame(1, &[], 0, 0));
    assert_eq!(
        futures::executor::block_on(h.session.next_output(&mut h.backend)),
        None
    );
    assert!(h.session.end_of_stream().is_ok());
}

#[test]
fn given_a_frame_cut_by_end_of_stream_when_closed_should_report_it() {
    let mut h = Harness::new();
    let frame = sdk_frame(1, &[], 0, 0);
    h.session.receive(&frame[..100]);
    assert_eq!(
        futures::executor::block_on(h.session.next_output(&mut h.backend)),
        None
    );
    assert_eq!(h.session.wanted(), 156);
    assert!(matches!(
        h.session.end_of_stream(),
        Err(FrameError::Truncated {
            received: 100,
            size: Some(256)
        })
    ));
}
