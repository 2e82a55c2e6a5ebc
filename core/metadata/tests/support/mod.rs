//! Helpers shared by the metadata tests: a state machine that numbers ops,
//! round-trips every op through the codec and checks that a refusal
//! changed nothing; cheap password hashes.
#![allow(dead_code, clippy::unwrap_used)]

use std::sync::OnceLock;

use common::Op;
use metadata::{
    Applied, ApplyError, HashParams, Identifier, MetadataOp, MetadataState, PasswordHash, Refusal,
    TopicConfig, hash_password,
};

/// Argon2id at its minimum cost: the tests check plumbing, not strength.
pub const CHEAP: HashParams = HashParams {
    memory_kib: 8,
    iterations: 1,
    parallelism: 1,
};

/// A hash of `password` with a fixed salt.
pub fn hash(password: &str) -> PasswordHash {
    hash_password(password, &[7u8; 16], CHEAP).unwrap()
}

/// The hash of "secret", computed once.
pub fn secret_hash() -> PasswordHash {
    static H: OnceLock<PasswordHash> = OnceLock::new();
    H.get_or_init(|| hash("secret")).clone()
}

/// A state and the next op number.
#[derive(Debug, Clone)]
pub struct Sm {
    pub state: MetadataState,
}

impl Default for Sm {
    fn default() -> Self {
        Self {
            state: MetadataState::new(),
        }
    }
}

impl Sm {
    /// Applies `op` as the next op (through encode and decode); on a
    /// refusal, asserts nothing but the applied op moved.
    pub fn apply(&mut self, op: MetadataOp) -> Result<Applied, Refusal> {
        let bytes = op.encode().unwrap();
        let decoded = MetadataOp::decode(&bytes).unwrap();
        assert_eq!(decoded, op);
        let before = self.state.clone();
        let next = Op(self.state.applied().0 + 1);
        match self.state.apply(next, &decoded) {
            Ok(a) => Ok(a),
            Err(ApplyError::Refused(r)) => {
                assert!(
                    self.state.eq_ignoring_applied(&before),
                    "refused {} changed the state",
                    op.name()
                );
                assert_eq!(self.state.applied(), next);
                Err(r)
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }

    pub fn ok(&mut self, op: MetadataOp) -> Applied {
        let name = op.name();
        self.apply(op)
            .unwrap_or_else(|r| panic!("{name} refused: {r}"))
    }

    pub fn code(&mut self, op: MetadataOp) -> u32 {
        let name = op.name();
        match self.apply(op) {
            Ok(_) => panic!("{name} was accepted"),
            Err(r) => r.iggy_code(),
        }
    }
}

pub fn create_stream(name: &str) -> MetadataOp {
    MetadataOp::CreateStream {
        name: name.into(),
        created_at_us: 1_000,
    }
}

pub fn create_topic(stream: impl Into<Identifier>, name: &str, partitions: u32) -> MetadataOp {
    MetadataOp::CreateTopic {
        stream: stream.into(),
        name: name.into(),
        partitions_count: partitions,
        config: TopicConfig::default(),
        created_at_us: 2_000,
    }
}

pub fn create_group(stream: u32, topic: u32, name: &str) -> MetadataOp {
    MetadataOp::CreateConsumerGroup {
        stream: stream.into(),
        topic: topic.into(),
        name: name.into(),
    }
}

pub fn join(stream: u32, topic: u32, group: u32, session: u64) -> MetadataOp {
    MetadataOp::JoinConsumerGroup {
        stream: stream.into(),
        topic: topic.into(),
        group: group.into(),
        session: metadata::SessionId(session),
    }
}

pub fn leave(stream: u32, topic: u32, group: u32, session: u64) -> MetadataOp {
    MetadataOp::LeaveConsumerGroup {
        stream: stream.into(),
        topic: topic.into(),
        group: group.into(),
        session: metadata::SessionId(session),
    }
}

pub fn create_user(name: &str) -> MetadataOp {
    MetadataOp::CreateUser {
        username: name.into(),
        password_hash: secret_hash(),
        created_at_us: 3_000,
    }
}
