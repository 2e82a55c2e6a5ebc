//! The client session a shard holds with each group it submits to (group
//! 0 and every partition group): opened by a Register, which is sent again
//! if no reply came within [`REGISTER_RETRY_TICKS`], and closed again when
//! the group forgets it.

use consensus::vsr::{Reply, ReplyStatus};

/// Ticks a session registration may take before it is sent again.
pub(crate) const REGISTER_RETRY_TICKS: u64 = 100;

/// A shard's session with one group.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Session {
    /// None opened yet (or the group forgot it).
    #[default]
    Closed,
    /// A Register is in flight (request 0), sent at this tick.
    Registering {
        /// The tick it was sent.
        since_tick: u64,
    },
    /// Open: the session number is the Register's op.
    Open {
        /// The session.
        session: u64,
    },
}

/// What a pump does with its queued calls at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionStep {
    /// Submit them under this session.
    Submit(u64),
    /// A Register is in flight and not yet due again: wait.
    Wait,
    /// Send a Register (none sent, or the last one is overdue).
    Register,
}

impl Session {
    /// What to do at `tick`.
    pub(crate) fn step(self, tick: u64) -> SessionStep {
        match self {
            Self::Open { session } => SessionStep::Submit(session),
            Self::Registering { since_tick }
                if tick.saturating_sub(since_tick) < REGISTER_RETRY_TICKS =>
            {
                SessionStep::Wait
            }
            Self::Closed | Self::Registering { .. } => SessionStep::Register,
        }
    }

    /// Takes the reply to a Register; returns whether the session opened.
    pub(crate) fn on_register_reply(&mut self, reply: &Reply) -> bool {
        match reply.status {
            ReplyStatus::Ok | ReplyStatus::AlreadyApplied => {
                *self = Self::Open {
                    session: registered_session(reply),
                };
                true
            }
            ReplyStatus::NoSession | ReplyStatus::Fenced => {
                *self = Self::Closed;
                false
            }
        }
    }
}

/// The session a committed Register opened: the one the client table
/// holds, which for a Register retried before its session was used is the
/// existing one, older than the retry's op. Taking the op there made every
/// request after it refused as from an unknown session and the Register
/// retried for ever (a partition group in mixed 21300169, group 0 in
/// mixed 22005380).
pub(crate) fn registered_session(reply: &Reply) -> u64 {
    if reply.session != 0 {
        reply.session
    } else {
        reply.op.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use common::Op;

    #[test]
    fn given_a_register_in_flight_should_wait_until_it_is_overdue() {
        assert_eq!(Session::Closed.step(5), SessionStep::Register);
        let registering = Session::Registering { since_tick: 10 };
        assert_eq!(registering.step(10), SessionStep::Wait);
        assert_eq!(
            registering.step(10 + REGISTER_RETRY_TICKS - 1),
            SessionStep::Wait
        );
        assert_eq!(
            registering.step(10 + REGISTER_RETRY_TICKS),
            SessionStep::Register
        );
        // A clock that went backwards never makes it overdue.
        assert_eq!(registering.step(3), SessionStep::Wait);
        assert_eq!(Session::Open { session: 7 }.step(0), SessionStep::Submit(7));
    }

    fn register_reply(op: u64, session: u64) -> Reply {
        Reply {
            client: 7,
            request: 0,
            op: Op(op),
            commit: Op(op),
            timestamp: 0,
            operation: consensus::vsr::OPERATION_REGISTER,
            status: ReplyStatus::Ok,
            session,
            result: 0,
        }
    }

    #[test]
    fn given_a_retried_register_answered_with_the_open_session_when_opening_should_take_that_session()
     {
        // A first Register at op 12 opened session 12.
        assert_eq!(registered_session(&register_reply(12, 12)), 12);
        // Retried at op 54 before the session was used: the table answers
        // with session 12, which requests must carry.
        assert_eq!(registered_session(&register_reply(54, 12)), 12);
        // A reply without a session names its op.
        assert_eq!(registered_session(&register_reply(9, 0)), 9);
    }

    #[test]
    fn given_register_replies_should_open_or_close_the_session() {
        let mut session = Session::Registering { since_tick: 1 };
        assert!(session.on_register_reply(&register_reply(12, 12)));
        assert_eq!(session, Session::Open { session: 12 });
        let mut refused = register_reply(13, 0);
        refused.status = ReplyStatus::NoSession;
        assert!(!session.on_register_reply(&refused));
        assert_eq!(session, Session::Closed);
    }
}
