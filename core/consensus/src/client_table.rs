//! The client table: per client session, what has committed, so that a
//! retried request is answered instead of executed a second time.
//!
//! Every replica updates the table only while applying committed ops, in
//! op order, from prepare fields alone, so all replicas derive the same
//! table; eviction when full is by lowest `latest_commit`, ties to the
//! lowest client id, which uses only committed data too. For state transfer
//! the table is exported as [`DedupWatermark`] slices sorted by client id,
//! and installing a slice replaces the table.
//!
//! A request number is looked up against the watermark (the highest
//! committed request) and the committed window (bit `i` ⇔ request
//! `watermark - i` committed). Only the watermark's reply is cached; an
//! older committed request is answered "already applied" and never
//! re-executed.

use std::collections::BTreeMap;
use std::fmt;

use common::Op;

use crate::dedup::DedupWatermark;
use crate::vsr::Reply;

/// Default number of client sessions a group keeps.
pub const CLIENTS_TABLE_MAX: usize = 8192;

/// Client id 0 is reserved for internal use and refused everywhere.
pub const CLIENT_RESERVED: u128 = 0;

/// What the table says about an incoming request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestCheck {
    /// Not seen committed: order it.
    New,
    /// The latest committed request: answer with its cached reply.
    Duplicate(Reply),
    /// Committed earlier, reply no longer cached: never re-execute.
    AlreadyApplied,
    /// Unknown client, or a session the table does not know.
    NoSession,
    /// An older session than the table's (a zombie from before a rebind).
    Fenced,
}

/// Bad input to the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientTableError {
    /// Client id 0 is reserved.
    ReservedClient,
    /// An installed slice names the same client twice.
    DuplicateClient {
        /// The repeated client id.
        client: u128,
    },
    /// An installed slice holds more clients than the table's capacity.
    TooManyClients {
        /// Entries offered.
        count: usize,
        /// The table's capacity.
        capacity: usize,
    },
    /// A restored session's cached reply is not the reply to its
    /// client's latest committed request.
    ReplyMismatch {
        /// The client whose record is inconsistent.
        client: u128,
    },
}

impl fmt::Display for ClientTableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ReservedClient => write!(f, "client id 0 is reserved and cannot hold a session"),
            Self::DuplicateClient { client } => {
                write!(f, "the installed client table names client {client} twice")
            }
            Self::TooManyClients { count, capacity } => write!(
                f,
                "the installed client table holds {count} clients but the capacity is {capacity}"
            ),
            Self::ReplyMismatch { client } => write!(
                f,
                "the restored session of client {client} caches a reply that is not its latest request's"
            ),
        }
    }
}

impl std::error::Error for ClientTableError {}

/// One client's whole entry, as a replica records it on its own disk so
/// that dedup survives a restart (state transfer carries only the
/// [`DedupWatermark`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    /// The op of the Register that opened the session; 0 when installed
    /// from a watermark slice (which does not carry it): any session is
    /// then accepted.
    pub session: u64,
    /// What has committed for the client.
    pub watermark: DedupWatermark,
    /// The reply to `watermark.watermark`, if cached.
    pub reply: Option<Reply>,
}

/// A group's client sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTable {
    capacity: usize,
    entries: BTreeMap<u128, SessionRecord>,
}

impl Default for ClientTable {
    fn default() -> Self {
        Self::new(CLIENTS_TABLE_MAX)
    }
}

impl ClientTable {
    /// An empty table holding at most `capacity` sessions (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            entries: BTreeMap::new(),
        }
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The session currently registered for `client`.
    pub fn session(&self, client: u128) -> Option<u64> {
        self.entries.get(&client).map(|e| e.session)
    }

    /// Look up a request before ordering it. `request == 0` is a Register:
    /// a retried Register whose session has not been used yet is answered
    /// from the cache, so registering stays idempotent.
    pub fn check(&self, client: u128, session: u64, request: u64) -> RequestCheck {
        if client == CLIENT_RESERVED {
            return RequestCheck::NoSession;
        }
        let Some(entry) = self.entries.get(&client) else {
            return if request == 0 {
                RequestCheck::New
            } else {
                RequestCheck::NoSession
            };
        };
        if request == 0 {
            return match &entry.reply {
                Some(r) if entry.watermark.watermark == 0 && r.request == 0 => {
                    RequestCheck::Duplicate(r.clone())
                }
                _ => RequestCheck::New,
            };
        }
        if entry.session != 0 && session < entry.session {
            return RequestCheck::Fenced;
        }
        if entry.session != 0 && session > entry.session {
            return RequestCheck::NoSession;
        }
        if request > entry.watermark.watermark {
            return RequestCheck::New;
        }
        if request == entry.watermark.watermark
            && let Some(r) = &entry.reply
        {
            return RequestCheck::Duplicate(r.clone());
        }
        if entry.watermark.covers(request) {
            RequestCheck::AlreadyApplied
        } else {
            RequestCheck::New
        }
    }

    /// The cached reply to `request`, if it is the client's latest.
    pub fn cached_reply(&self, client: u128, request: u64) -> Option<Reply> {
        let entry = self.entries.get(&client)?;
        entry.reply.clone().filter(|r| r.request == request)
    }

    /// Apply a committed Register at `op`. Returns the session and whether
    /// it was newly opened (false: a retried Register of a session not yet
    /// used, answered with the existing session).
    pub fn register(
        &mut self,
        client: u128,
        user_id: u32,
        op: Op,
        reply: Reply,
    ) -> Result<(u64, bool), ClientTableError> {
        if client == CLIENT_RESERVED {
            return Err(ClientTableError::ReservedClient);
        }
        if let Some(entry) = self.entries.get_mut(&client) {
            if entry.watermark.watermark == 0 {
                // Decided from replicated fields only, so a table installed
                // from watermarks decides the same as one built by applying.
                return Ok((entry.session, false));
            }
            // A rebind: a newer session, the watermark is kept.
            entry.session = op.0;
            entry.watermark.user_id = user_id;
            entry.watermark.latest_commit = op;
            entry.reply = (entry.watermark.watermark == 0).then_some(reply);
            return Ok((op.0, true));
        }
        if self.entries.len() >= self.capacity {
            self.evict_one();
        }
        self.entries.insert(
            client,
            SessionRecord {
                session: op.0,
                watermark: DedupWatermark {
                    client,
                    user_id,
                    watermark: 0,
                    latest_commit: op,
                    committed_window: 1,
                },
                reply: Some(reply),
            },
        );
        Ok((op.0, true))
    }

    /// Deterministic eviction: the lowest `latest_commit`, ties to the
    /// lowest client id.
    fn evict_one(&mut self) {
        let victim = self
            .entries
            .values()
            .min_by_key(|e| (e.watermark.latest_commit, e.watermark.client))
            .map(|e| e.watermark.client);
        if let Some(client) = victim {
            self.entries.remove(&client);
        }
    }

    /// Apply a committed request at `op`. Returns true when it must be
    /// executed, false when it already committed (a retry that was ordered
    /// twice): the caller then skips it.
    pub fn commit(&mut self, client: u128, request: u64, op: Op, reply: Reply) -> bool {
        let Some(entry) = self.entries.get_mut(&client) else {
            // Session evicted between admission and commit: nothing to
            // deduplicate against, the op executes.
            return true;
        };
        let w = &mut entry.watermark;
        if w.covers(request) {
            return false;
        }
        if request > w.watermark {
            let shift = request - w.watermark;
            w.committed_window = if shift >= 128 {
                0
            } else {
                w.committed_window << shift
            };
            w.committed_window |= 1;
            w.watermark = request;
            entry.reply = Some(reply);
        } else {
            w.committed_window |= 1u128 << (w.watermark - request);
        }
        w.latest_commit = w.latest_commit.max(op);
        true
    }

    /// Records what the host's state machine made of `client`'s request
    /// committed at `op` (see [`Reply::result`]) in the cached reply, if
    /// that reply is still the cached one. Every replica applies the same
    /// op to the same state, so every table caches the same result.
    pub fn set_result(&mut self, client: u128, request: u64, op: Op, result: u64) {
        if let Some(reply) = self
            .entries
            .get_mut(&client)
            .and_then(|e| e.reply.as_mut())
            .filter(|r| r.request == request && r.op == op)
        {
            reply.result = result;
        }
    }

    /// Every entry, sessions and cached replies included, sorted by client
    /// id: what a replica records so that a restart keeps its dedup.
    pub fn sessions(&self) -> Vec<SessionRecord> {
        self.entries.values().cloned().collect()
    }

    /// Replaces the table with recorded entries. Validates them all first
    /// (no client 0, no client twice, within capacity, each cached reply
    /// the reply to its client's latest request); on error the table is
    /// unchanged.
    pub fn restore(&mut self, records: Vec<SessionRecord>) -> Result<(), ClientTableError> {
        if records.len() > self.capacity {
            return Err(ClientTableError::TooManyClients {
                count: records.len(),
                capacity: self.capacity,
            });
        }
        let mut entries = BTreeMap::new();
        for record in records {
            let client = record.watermark.client;
            if client == CLIENT_RESERVED {
                return Err(ClientTableError::ReservedClient);
            }
            if record
                .reply
                .as_ref()
                .is_some_and(|r| r.client != client || r.request != record.watermark.watermark)
            {
                return Err(ClientTableError::ReplyMismatch { client });
            }
            if entries.insert(client, record).is_some() {
                return Err(ClientTableError::DuplicateClient { client });
            }
        }
        self.entries = entries;
        Ok(())
    }

    /// The table as state transfer carries it, sorted by client id.
    pub fn export(&self) -> Vec<DedupWatermark> {
        self.entries.values().map(|e| e.watermark).collect()
    }

    /// Replace the table with an exported slice. Validates the whole slice
    /// first; on error the table is unchanged.
    pub fn install(&mut self, slice: &[DedupWatermark]) -> Result<(), ClientTableError> {
        if slice.len() > self.capacity {
            return Err(ClientTableError::TooManyClients {
                count: slice.len(),
                capacity: self.capacity,
            });
        }
        let mut entries = BTreeMap::new();
        for w in slice {
            if w.client == CLIENT_RESERVED {
                return Err(ClientTableError::ReservedClient);
            }
            // A session not yet used has no commit after its Register, so
            // its session (the Register's op) is `latest_commit`; a used
            // session's epoch is not carried and any session is accepted.
            let session = if w.watermark == 0 {
                w.latest_commit.0
            } else {
                0
            };
            let previous = entries.insert(
                w.client,
                SessionRecord {
                    session,
                    watermark: *w,
                    reply: None,
                },
            );
            if previous.is_some() {
                return Err(ClientTableError::DuplicateClient { client: w.client });
            }
        }
        self.entries = entries;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::vsr::ReplyStatus;
    use common::Op;

    fn reply(client: u128, request: u64, op: u64) -> Reply {
        Reply {
            client,
            request,
            op: Op(op),
            commit: Op(op),
            timestamp: op,
            operation: 3,
            status: ReplyStatus::Ok,
            session: 0,
            result: 0,
        }
    }

    #[test]
    fn given_reserved_client_when_registered_should_refuse() {
        let mut t = ClientTable::new(4);
        assert_eq!(
            t.register(0, 1, Op(1), reply(0, 0, 1)),
            Err(ClientTableError::ReservedClient)
        );
        assert_eq!(t.check(0, 0, 0), RequestCheck::NoSession);
    }

    #[test]
    fn given_committed_request_when_retried_should_answer_from_table() {
        let mut t = ClientTable::new(4);
        let (session, _) = t.register(7, 1, Op(1), reply(7, 0, 1)).unwrap();
        assert_eq!(t.check(7, session, 1), RequestCheck::New);
        assert!(t.commit(7, 1, Op(2), reply(7, 1, 2)));
        assert_eq!(
            t.check(7, session, 1),
            RequestCheck::Duplicate(reply(7, 1, 2))
        );
        assert!(
            !t.commit(7, 1, Op(3), reply(7, 1, 3)),
            "never executed twice"
        );
        assert!(t.commit(7, 3, Op(4), reply(7, 3, 4)));
        assert_eq!(t.check(7, session, 1), RequestCheck::AlreadyApplied);
        assert_eq!(
            t.check(7, session, 2),
            RequestCheck::New,
            "gap not committed"
        );
        assert_eq!(t.check(7, session - 1, 3), RequestCheck::Fenced);
    }

    #[test]
    fn given_full_table_when_registering_should_evict_lowest_latest_commit() {
        let mut t = ClientTable::new(2);
        t.register(5, 1, Op(1), reply(5, 0, 1)).unwrap();
        t.register(6, 1, Op(2), reply(6, 0, 2)).unwrap();
        t.commit(5, 1, Op(3), reply(5, 1, 3));
        t.register(9, 1, Op(4), reply(9, 0, 4)).unwrap();
        let clients: Vec<u128> = t.export().iter().map(|w| w.client).collect();
        assert_eq!(clients, vec![5, 9]);
    }

    #[test]
    fn given_export_when_installed_should_round_trip_and_refuse_duplicates() {
        let mut t = ClientTable::new(8);
        for c in [3u128, 1, 2] {
            t.register(c, 1, Op(c as u64), reply(c, 0, c as u64))
                .unwrap();
            t.commit(c, 4, Op(10) + c as u64, reply(c, 4, 10 + c as u64));
        }
        let slice = t.export();
        assert!(slice.windows(2).all(|w| w[0].client < w[1].client));
        let mut u = ClientTable::new(8);
        u.install(&slice).unwrap();
        assert_eq!(u.export(), slice);
        assert_eq!(u.check(1, 99, 4), RequestCheck::AlreadyApplied);
        let dup = [slice[0], slice[0]];
        assert!(matches!(
            u.install(&dup),
            Err(ClientTableError::DuplicateClient { .. })
        ));
        assert_eq!(u.export(), slice, "a refused install changes nothing");
    }

    #[test]
    fn given_recorded_sessions_when_restored_should_answer_retries_with_the_original_result() {
        let mut t = ClientTable::new(8);
        let (session, _) = t.register(7, 1, Op(1), reply(7, 0, 1)).unwrap();
        assert!(t.commit(7, 1, Op(2), reply(7, 1, 2)));
        t.set_result(7, 1, Op(2), 4_096);
        t.set_result(7, 1, Op(9), 1);
        t.register(3, 2, Op(3), reply(3, 0, 3)).unwrap();
        let mut u = ClientTable::new(8);
        u.restore(t.sessions()).unwrap();
        assert_eq!(u, t);
        let RequestCheck::Duplicate(answer) = u.check(7, session, 1) else {
            panic!("the retry is not answered from the table");
        };
        assert_eq!((answer.op, answer.result), (Op(2), 4_096));
        assert!(
            !u.commit(7, 1, Op(5), reply(7, 1, 5)),
            "never executed twice"
        );
        assert!(matches!(u.check(3, 0, 0), RequestCheck::Duplicate(_)));
    }

    #[test]
    fn given_inconsistent_records_when_restored_should_refuse_and_change_nothing() {
        let mut t = ClientTable::new(2);
        t.register(7, 1, Op(1), reply(7, 0, 1)).unwrap();
        t.commit(7, 4, Op(2), reply(7, 4, 2));
        let good = t.sessions();
        let mut u = ClientTable::new(2);
        u.restore(good.clone()).unwrap();
        let mut wrong_reply = good.clone();
        wrong_reply[0].reply = Some(reply(7, 3, 2));
        let mut foreign_reply = good.clone();
        foreign_reply[0].reply = Some(reply(8, 4, 2));
        let mut reserved = good.clone();
        reserved[0].watermark.client = 0;
        let twice = vec![good[0].clone(), good[0].clone()];
        let too_many = vec![good[0].clone(); 3];
        for (bad, want) in [
            (wrong_reply, ClientTableError::ReplyMismatch { client: 7 }),
            (foreign_reply, ClientTableError::ReplyMismatch { client: 7 }),
            (reserved, ClientTableError::ReservedClient),
            (twice, ClientTableError::DuplicateClient { client: 7 }),
            (
                too_many,
                ClientTableError::TooManyClients {
                    count: 3,
                    capacity: 2,
                },
            ),
        ] {
            assert_eq!(u.restore(bad), Err(want));
            assert_eq!(u.sessions(), good, "a refused restore changes nothing");
        }
    }

    #[test]
    fn given_retried_register_when_session_unused_should_return_same_session() {
        let mut t = ClientTable::new(4);
        let (s1, new1) = t.register(8, 1, Op(5), reply(8, 0, 5)).unwrap();
        let (s2, new2) = t.register(8, 1, Op(9), reply(8, 0, 9)).unwrap();
        assert!(new1 && !new2);
        assert_eq!(s1, s2);
    }
}
