//! One client connection's protocol state machine, sans-IO.
//!
//! A driver owns the socket. It reads [`Session::wanted`] bytes at a time
//! (exact reads: a compio read is not cancel-safe), hands them to
//! [`Session::receive`], and calls [`Session::next_output`] until it
//! returns `None`, writing every [`Output::Reply`] and closing on
//! [`Output::Close`]. At end of stream it calls [`Session::disconnect`].
//! One request is handled at a time and answered before the next is
//! looked at, which is the protocol's lockstep (client_protocol.md §1).
//!
//! The session holds what the protocol keeps per connection (§12.1): the
//! login (user and session number), and the consumer groups joined.
//! Before login only PING, GET_CLUSTER_METADATA and the login itself are
//! served; everything else gets Unauthenticated (40). A failed login gets
//! an eviction (reason 9 for bad credentials, 14 for a protocol version
//! outside the window, 15 for a login body that does not decode), and the
//! connection stays open, unauthenticated, until
//! [`ClientLimits::login_failures_max`] bad credentials: the driver closes
//! it after that eviction ([`Session::take_login_event`]). Until a login
//! succeeds, frames are held to the small
//! [`ClientLimits::frame_size_before_login_bytes`] ceiling.

mod backend;
#[cfg(test)]
pub(crate) mod memory;
#[cfg(test)]
mod tests;

pub use backend::{Backend, BackendError, BackendResult, Caller, ErrorClass, LoginGrant};

use crate::protocol::codes::{OPERATION_NON_REPLICATED, OPERATION_REGISTER};
use crate::protocol::records::{
    ClientDetails, ClusterMetadata, JoinedGroup, LoginResult, MemberId, Payload,
};
use crate::protocol::{
    ClientCommand, CommandCode, EvictionReason, FrameError, FrameReader, GroupRef, Identifier,
    Name, Outcome, PROTOCOL_VERSION, RequestFrame, TopicRef, VERSION_WINDOW, encode_eviction,
    encode_reply, protocol_compatible,
};
use crate::status::ErrorCode;
use consensus::header::RequestHeader;
use std::collections::BTreeSet;
use std::sync::Arc;

/// What a listener allows a client connection (docs/operations.md
/// "Security"); every limit has a safe default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// Connections served at once; one past it is closed at accept.
    pub connections_max: u32,
    /// Ceiling on a request frame before the connection logged in (a
    /// login, a ping and a metadata request are all small).
    pub frame_size_before_login_bytes: u32,
    /// How long a connection may stay without logging in.
    pub login_timeout: std::time::Duration,
    /// How long a logged-in connection may send nothing; `None` never
    /// closes it.
    pub idle_timeout: Option<std::time::Duration>,
    /// How long the rest of a started frame may take to arrive, and a
    /// reply to be written.
    pub io_timeout: std::time::Duration,
    /// Failed logins (bad credentials) a connection gets before it is
    /// closed.
    pub login_failures_max: u32,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            connections_max: 4096,
            frame_size_before_login_bytes: 16 * 1024,
            login_timeout: std::time::Duration::from_secs(10),
            idle_timeout: Some(std::time::Duration::from_secs(300)),
            io_timeout: std::time::Duration::from_secs(30),
            login_failures_max: 3,
        }
    }
}

/// What a request did to the connection's login, for the driver: it
/// delays a failed login's answer by its source address's recent failures
/// and closes the connection after the last one allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginEvent {
    /// A login succeeded.
    Succeeded,
    /// Bad credentials; `last` when the connection is to be closed once
    /// the answer is written.
    Failed {
        /// Whether this was the last failure the connection is allowed.
        last: bool,
    },
}

/// What every session of a listener shares.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    /// Ceiling on a request frame, header included (after login).
    pub frame_size_max_bytes: u32,
    /// The listener's limits.
    pub limits: ClientLimits,
    /// The GET_CLUSTER_METADATA answer: this replica as the one leader.
    pub cluster: ClusterMetadata,
    /// The version text sent in login replies.
    pub server_version: Name,
}

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Write this frame (a reply or an eviction); the connection goes on.
    Reply(Vec<u8>),
    /// Close the connection without writing: the byte stream is no longer
    /// aligned on frames.
    Close(FrameError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Login {
    Anonymous,
    LoggedIn(LoginGrant),
}

/// The last send of a connection (see [`Session::last_send`]).
#[derive(Debug, Clone, Copy)]
struct LastSend {
    /// The Iggy client id and request number.
    id: (u128, u64),
    /// Whether an answer to it left its outcome unknown.
    unknown: bool,
    /// When it was first received.
    first_at: std::time::Instant,
}

/// One client connection.
#[derive(Debug)]
pub struct Session {
    config: Arc<SessionConfig>,
    member: MemberId,
    address: String,
    reader: FrameReader,
    login: Login,
    joined: BTreeSet<JoinedGroup>,
    failed: bool,
    /// The command of the last request handled, until taken.
    handled: Option<CommandCode>,
    /// The Iggy client id and request number of the last send, and
    /// whether an answer to it left its outcome unknown (57), to tell a
    /// replay of it (the SDK resends a request answered 57 under the same
    /// number) from a new send or a resend of one never admitted (58).
    last_send: Option<LastSend>,
    /// Logins refused for bad credentials on this connection.
    login_failures: u32,
    /// What the last request did to the login, until taken.
    login_event: Option<LoginEvent>,
}

impl Session {
    /// A session for connection `member` from `address`.
    pub fn new(config: Arc<SessionConfig>, member: MemberId, address: impl Into<String>) -> Self {
        let reader = FrameReader::new(before_login_ceiling(&config));
        Self {
            config,
            member,
            address: address.into(),
            reader,
            login: Login::Anonymous,
            joined: BTreeSet::new(),
            failed: false,
            handled: None,
            last_send: None,
            login_failures: 0,
            login_event: None,
        }
    }

    /// What the last request answered did to the login, once.
    pub fn take_login_event(&mut self) -> Option<LoginEvent> {
        self.login_event.take()
    }

    /// How many bytes to read next (never past the current frame).
    pub fn wanted(&self) -> usize {
        self.reader.wanted()
    }

    /// Bytes of a started frame buffered so far.
    pub fn buffered(&self) -> usize {
        self.reader.buffered()
    }

    /// The listener's limits.
    pub fn limits(&self) -> ClientLimits {
        self.config.limits
    }

    /// Buffers bytes read from the socket.
    pub fn receive(&mut self, bytes: &[u8]) {
        self.reader.push(bytes);
    }

    /// Whether the connection is logged in.
    pub fn is_logged_in(&self) -> bool {
        matches!(self.login, Login::LoggedIn(_))
    }

    /// The groups this connection has joined.
    pub fn joined_groups(&self) -> impl Iterator<Item = &JoinedGroup> {
        self.joined.iter()
    }

    /// Handles the next buffered request, if a whole one is buffered.
    /// After an [`Output::Close`] it returns `None` forever.
    pub async fn next_output<B: Backend>(&mut self, backend: &mut B) -> Option<Output> {
        if self.failed {
            return None;
        }
        match self.reader.next_frame() {
            Ok(None) => None,
            Ok(Some(frame)) => Some(Output::Reply(self.handle(&frame, backend).await)),
            Err(e) => {
                self.failed = true;
                Some(Output::Close(e))
            }
        }
    }

    /// The command of the request the last [`Session::next_output`]
    /// answered, once (for the driver's latency metrics); `None` when it
    /// named no command this protocol knows.
    pub fn take_handled(&mut self) -> Option<CommandCode> {
        self.handled.take()
    }

    /// Call at end of stream: an unfinished frame is reported.
    pub fn end_of_stream(&self) -> Result<(), FrameError> {
        if self.failed {
            return Ok(());
        }
        self.reader.finish()
    }

    /// The connection is gone: leaves every joined group and ends the
    /// login (membership is per connection, client_protocol.md §10).
    pub async fn disconnect<B: Backend>(&mut self, backend: &mut B) {
        self.end_login(backend).await;
    }

    /// Answers one request frame.
    pub async fn handle<B: Backend>(&mut self, frame: &RequestFrame, backend: &mut B) -> Vec<u8> {
        let h = &frame.header;
        let code = match frame.command_code() {
            Ok(code) => code,
            Err(e) => return encode_reply(h, Outcome::Denied(ErrorCode::from(&e))),
        };
        self.handled = Some(code);
        let caller = match self.login {
            Login::LoggedIn(grant) => Some(Caller {
                user: grant.user,
                member: self.member,
            }),
            Login::Anonymous => None,
        };
        if code.requires_login() && caller.is_none() {
            return encode_reply(h, Outcome::Denied(ErrorCode::Unauthenticated));
        }
        if let Login::LoggedIn(grant) = self.login
            && !session_matches(h, grant)
        {
            return encode_reply(h, Outcome::Denied(ErrorCode::Unauthenticated));
        }
        let command = match frame.decode_command() {
            Ok(command) => command,
            Err(_) if code == CommandCode::LoginRegister => {
                return evict(h, EvictionReason::MalformedLogin);
            }
            Err(e) => return encode_reply(h, Outcome::Denied(ErrorCode::from(&e))),
        };
        match (command, caller) {
            (ClientCommand::Ping, _) => encode_reply(h, Outcome::Ok(&[])),
            (ClientCommand::GetClusterMetadata, _) => {
                encode_reply(h, Outcome::Ok(&self.config.cluster.to_bytes()))
            }
            (ClientCommand::LoginRegister(login), _) => {
                if !protocol_compatible(login.protocol_version) {
                    return evict(h, EvictionReason::IncompatibleProtocol);
                }
                match backend.login(&login.username, &login.password).await {
                    Ok(grant) => {
                        // A second login on a logged-in connection replaces
                        // the first (the SDK logs out first anyway).
                        self.end_login(backend).await;
                        self.login = Login::LoggedIn(grant);
                        self.reader.set_size_max(self.config.frame_size_max_bytes);
                        self.login_event = Some(LoginEvent::Succeeded);
                        let result = LoginResult {
                            user_id: grant.user,
                            session: grant.session,
                            server_protocol_version: PROTOCOL_VERSION,
                            server_version: self.config.server_version.clone(),
                        };
                        encode_reply(h, Outcome::Ok(&result.to_bytes()))
                    }
                    // Not a wrong password: the same answer (the SDK moves
                    // on), not counted.
                    Err(BackendError::NotReady) => evict(h, EvictionReason::InvalidCredentials),
                    Err(BackendError::InvalidCredentials) => {
                        self.login_failures = self.login_failures.saturating_add(1);
                        self.login_event = Some(LoginEvent::Failed {
                            last: self.login_failures >= self.config.limits.login_failures_max,
                        });
                        evict(h, EvictionReason::InvalidCredentials)
                    }
                    Err(e) => encode_reply(h, Outcome::Rejected(ErrorCode::from(&e))),
                }
            }
            (command, Some(caller)) => self.execute(h, caller, command, backend).await,
            // Gated above: every other command requires a login.
            (_, None) => encode_reply(h, Outcome::Denied(ErrorCode::Unauthenticated)),
        }
    }

    async fn execute<B: Backend>(
        &mut self,
        h: &RequestHeader,
        caller: Caller,
        command: ClientCommand,
        b: &mut B,
    ) -> Vec<u8> {
        use ClientCommand as C;
        match command {
            C::Ping | C::GetClusterMetadata | C::LoginRegister(_) => {
                // `handle` answers these itself, logged in or not; reaching
                // here would be a dispatch bug, answered as a bad command
                // rather than a panic on the connection's thread.
                tracing::error!(
                    operation = h.operation,
                    "request reached execute unexpectedly"
                );
                encode_reply(h, Outcome::Denied(ErrorCode::InvalidCommand))
            }
            C::GetMe => {
                let me = ClientDetails {
                    client_id: self.member.0,
                    user_id: Some(caller.user),
                    address: self.address.clone(),
                    consumer_groups: self.joined.iter().copied().collect(),
                };
                encode_reply(h, Outcome::Ok(&me.to_bytes()))
            }
            C::Logout => {
                self.end_login(b).await;
                encode_reply(h, Outcome::Ok(&[]))
            }
            C::PollMessages(r) => answer(h, b.poll_messages(caller, &r).await),
            C::SendMessages(mut r) => {
                let id = (h.client, h.request);
                let now = std::time::Instant::now();
                let first_at = match self.last_send {
                    Some(last) if last.id == id => {
                        r.replay = last.unknown;
                        last.first_at
                    }
                    _ => now,
                };
                let age = now.saturating_duration_since(first_at).as_millis();
                r.replay_age_ms = u32::try_from(age).unwrap_or(u32::MAX);
                r.producer_key = r.producer_key(h.client, h.request);
                let sent = b.send_messages(caller, &r).await;
                let unknown = r.replay || matches!(sent, Err(BackendError::NotCommitted));
                self.last_send = Some(LastSend {
                    id,
                    unknown,
                    first_at,
                });
                answer(h, sent)
            }
            C::FlushUnsavedBuffer(r) => unit(h, b.flush_unsaved_buffer(caller, &r).await),
            C::GetConsumerOffset(r) => maybe(h, b.get_consumer_offset(caller, &r).await),
            C::StoreConsumerOffset(r) => unit(h, b.store_consumer_offset(caller, &r).await),
            C::DeleteConsumerOffset(r) => unit(h, b.delete_consumer_offset(caller, &r).await),
            C::GetStream(id) => maybe(h, b.get_stream(caller, &id).await),
            C::GetStreams => answer(h, b.get_streams(caller).await),
            C::CreateStream(r) => answer(h, b.create_stream(caller, &r).await),
            C::DeleteStream(id) => unit(h, b.delete_stream(caller, &id).await),
            C::UpdateStream(r) => unit(h, b.update_stream(caller, &r).await),
            C::PurgeStream(id) => unit(h, b.purge_stream(caller, &id).await),
            C::GetTopic(r) => maybe(h, b.get_topic(caller, &r).await),
            C::GetTopics(id) => answer(h, b.get_topics(caller, &id).await),
            C::CreateTopic(r) => answer(h, b.create_topic(caller, &r).await),
            C::DeleteTopic(r) => unit(h, b.delete_topic(caller, &r).await),
            C::UpdateTopic(r) => unit(h, b.update_topic(caller, &r).await),
            C::PurgeTopic(r) => unit(h, b.purge_topic(caller, &r).await),
            C::CreatePartitions(r) => unit(h, b.create_partitions(caller, &r).await),
            C::DeletePartitions(r) => unit(h, b.delete_partitions(caller, &r).await),
            C::GetConsumerGroup(r) => maybe(h, b.get_consumer_group(caller, &r).await),
            C::GetConsumerGroups(r) => answer(h, b.get_consumer_groups(caller, &r).await),
            C::CreateConsumerGroup(r) => answer(h, b.create_consumer_group(caller, &r).await),
            C::DeleteConsumerGroup(r) => unit(h, b.delete_consumer_group(caller, &r).await),
            C::JoinConsumerGroup(r) => {
                let joined = b.join_consumer_group(caller, &r).await;
                if let Ok(group) = &joined {
                    self.joined.insert(*group);
                }
                unit(h, joined.map(drop))
            }
            C::LeaveConsumerGroup(r) => {
                let left = b.leave_consumer_group(caller, &r).await;
                if let Ok(group) = &left {
                    self.joined.remove(group);
                }
                unit(h, left.map(drop))
            }
            C::SyncConsumerGroup(r) => maybe(h, b.sync_consumer_group(caller, &r).await),
            C::ReplogStatus => answer(h, b.replica_status(caller).await),
            C::Unimplemented(_) => encode_reply(h, Outcome::Denied(ErrorCode::FeatureUnavailable)),
        }
    }

    /// Leaves every joined group and logs out, if logged in. Errors are
    /// not the client's to see (it is leaving); the backend drops members
    /// on its own timeout as well.
    async fn end_login<B: Backend>(&mut self, backend: &mut B) {
        let Login::LoggedIn(grant) = self.login else {
            return;
        };
        let caller = Caller {
            user: grant.user,
            member: self.member,
        };
        for g in std::mem::take(&mut self.joined) {
            let group = GroupRef {
                topic: TopicRef {
                    stream: Identifier::Numeric(g.stream.0),
                    topic: Identifier::Numeric(g.topic.0),
                },
                group: Identifier::Numeric(g.group.0),
            };
            if let Err(e) = backend.leave_consumer_group(caller, &group).await {
                tracing::debug!(member = self.member.0, error = %e, "leaving group on logout failed");
            }
        }
        if let Err(e) = backend.logout(caller).await {
            tracing::debug!(member = self.member.0, error = %e, "logout failed");
        }
        self.login = Login::Anonymous;
        self.reader.set_size_max(before_login_ceiling(&self.config));
    }
}

/// The frame ceiling until a login: the smaller of the two.
fn before_login_ceiling(config: &SessionConfig) -> u32 {
    config
        .limits
        .frame_size_before_login_bytes
        .min(config.frame_size_max_bytes)
}

/// A logged-in connection's requests carry its session, except the
/// non-replicated ones, which may carry 0 (the SDK sends PING that way).
fn session_matches(h: &RequestHeader, grant: LoginGrant) -> bool {
    match h.operation {
        OPERATION_REGISTER => true,
        OPERATION_NON_REPLICATED => h.session == 0 || h.session == grant.session.get(),
        _ => h.session == grant.session.get(),
    }
}

fn evict(h: &RequestHeader, reason: EvictionReason) -> Vec<u8> {
    encode_eviction(h.client, reason, VERSION_WINDOW).to_vec()
}

fn answer<T: Payload>(h: &RequestHeader, result: BackendResult<T>) -> Vec<u8> {
    match result {
        Ok(payload) => encode_reply(h, Outcome::Ok(&payload.to_bytes())),
        Err(e) => encode_reply(h, Outcome::Rejected(ErrorCode::from(&e))),
    }
}

/// "Not found" is an empty body with status 0 (client_protocol.md §12.3 #2).
fn maybe<T: Payload>(h: &RequestHeader, result: BackendResult<Option<T>>) -> Vec<u8> {
    match result {
        Ok(Some(payload)) => encode_reply(h, Outcome::Ok(&payload.to_bytes())),
        Ok(None) => encode_reply(h, Outcome::Ok(&[])),
        Err(e) => encode_reply(h, Outcome::Rejected(ErrorCode::from(&e))),
    }
}

fn unit(h: &RequestHeader, result: BackendResult<()>) -> Vec<u8> {
    match result {
        Ok(()) => encode_reply(h, Outcome::Ok(&[])),
        Err(e) => encode_reply(h, Outcome::Rejected(ErrorCode::from(&e))),
    }
}
