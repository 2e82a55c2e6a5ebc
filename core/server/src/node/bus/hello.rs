//! The replica bus handshake: the dialer's [`Hello`], the accepter's
//! [`Challenge`], the dialer's [`Proof`] and the accepter's [`Verdict`],
//! fixed-size, little-endian, each ending in an xxh3-64 of the bytes
//! before it. The two proofs are the cluster secret's (`auth.rs`); a hello
//! that fails a check before them is answered by a refusing verdict at
//! once.
//!
//! ```text
//! Hello (64 bytes)                     Challenge (64 bytes)
//!   0  magic "RPLB"                      0  magic "RPLC"
//!   4  version u16 (2)                   4  version u16 (2)
//!   6  lane u8 (0 shard, 1 forward)      6  reserved u16 (0)
//!   7  from u8                           8  accepter's nonce [u8; 16]
//!   8  to u8                            24  accepter's proof [u8; 32]
//!   9  reserved u8 (0)                  56  xxh3-64 of bytes 0..56
//!  10  shard index u16
//!  12  shard count u16                 Proof (48 bytes)
//!  14  reserved u16 (0)                  0  magic "RPLP"
//!  16  cluster u128                      4  version u16 (2)
//!  32  incarnation u64                   6  reserved u16 (0)
//!  40  dialer's nonce [u8; 16]           8  dialer's proof [u8; 32]
//!  56  xxh3-64 of bytes 0..56           40  xxh3-64 of bytes 0..40
//!
//! Verdict (24 bytes)
//!   0  magic "RPLV"
//!   4  version u16 (2)
//!   6  code u8 (0 accepted, else a refusal)
//!   7  reserved u8 (0)
//!   8  accepter's incarnation u64
//!  16  xxh3-64 of bytes 0..16
//! ```
//!
//! The accepter checks a hello in a fixed order and names the first
//! failure ([`Refusal`]); the dialer logs the verdict's reason. Decoders
//! fail closed: a wrong magic, version, checksum, reserved byte or lane
//! is an error, never a guess.

use std::fmt;

use common::ReplicaId;
use xxhash_rust::xxh3::xxh3_64;

use super::auth::{NONCE_SIZE, PROOF_SIZE};

/// Bytes of an encoded [`Hello`].
pub const HELLO_SIZE: usize = 64;
/// Bytes of an encoded [`Verdict`].
pub const VERDICT_SIZE: usize = 24;
/// Bytes of an encoded [`Challenge`].
pub const CHALLENGE_SIZE: usize = 64;
/// Bytes of an encoded [`Proof`].
pub const PROOF_MESSAGE_SIZE: usize = 48;

/// "RPLB" as a little-endian u32.
const HELLO_MAGIC: u32 = u32::from_le_bytes(*b"RPLB");
/// "RPLV" as a little-endian u32.
const VERDICT_MAGIC: u32 = u32::from_le_bytes(*b"RPLV");
/// "RPLC" as a little-endian u32.
const CHALLENGE_MAGIC: u32 = u32::from_le_bytes(*b"RPLC");
/// "RPLP" as a little-endian u32.
const PROOF_MAGIC: u32 = u32::from_le_bytes(*b"RPLP");
/// Version 1 had no proofs; a version-1 hello is refused as malformed.
const VERSION: u16 = 2;

/// The fields of a hello (docs/formats.md §14), each declared once for the
/// encoder and the decoder.
mod hello_fields {
    use std::ops::Range;

    use common::le_cursor::{LeField, tiles};

    pub(super) const MAGIC: LeField<u32> = LeField::at(0);
    pub(super) const VERSION: LeField<u16> = LeField::at(4);
    pub(super) const LANE: LeField<u8> = LeField::at(6);
    pub(super) const FROM: LeField<u8> = LeField::at(7);
    pub(super) const TO: LeField<u8> = LeField::at(8);
    pub(super) const RESERVED_A: LeField<u8> = LeField::at(9);
    pub(super) const SHARD: LeField<u16> = LeField::at(10);
    pub(super) const SHARD_COUNT: LeField<u16> = LeField::at(12);
    pub(super) const RESERVED_B: LeField<u16> = LeField::at(14);
    pub(super) const CLUSTER: LeField<u128> = LeField::at(16);
    pub(super) const INCARNATION: LeField<u64> = LeField::at(32);
    pub(super) const NONCE: Range<usize> = INCARNATION.end()..SUM.start();
    /// xxh3-64 of every byte before it.
    pub(super) const SUM: LeField<u64> = LeField::at(56);
    const _: () = assert!(tiles(
        super::HELLO_SIZE,
        &[
            MAGIC.range(),
            VERSION.range(),
            LANE.range(),
            FROM.range(),
            TO.range(),
            RESERVED_A.range(),
            SHARD.range(),
            SHARD_COUNT.range(),
            RESERVED_B.range(),
            CLUSTER.range(),
            INCARNATION.range(),
            NONCE,
            SUM.range(),
        ]
    ));
}

/// The fields of a verdict (docs/formats.md §14).
mod verdict_fields {
    use common::le_cursor::{LeField, tiles};

    pub(super) const MAGIC: LeField<u32> = LeField::at(0);
    pub(super) const VERSION: LeField<u16> = LeField::at(4);
    pub(super) const CODE: LeField<u8> = LeField::at(6);
    pub(super) const RESERVED: LeField<u8> = LeField::at(7);
    pub(super) const INCARNATION: LeField<u64> = LeField::at(8);
    /// xxh3-64 of every byte before it.
    pub(super) const SUM: LeField<u64> = LeField::at(16);
    const _: () = assert!(tiles(
        super::VERDICT_SIZE,
        &[
            MAGIC.range(),
            VERSION.range(),
            CODE.range(),
            RESERVED.range(),
            INCARNATION.range(),
            SUM.range(),
        ]
    ));
}

/// The fields of a challenge and a proof (docs/formats.md §14).
mod proof_fields {
    use std::ops::Range;

    use common::le_cursor::{LeField, tiles};

    pub(super) const MAGIC: LeField<u32> = LeField::at(0);
    pub(super) const VERSION: LeField<u16> = LeField::at(4);
    pub(super) const RESERVED: LeField<u16> = LeField::at(6);
    /// The challenge's nonce.
    pub(super) const NONCE: Range<usize> = 8..24;
    /// The challenge's proof.
    pub(super) const CHALLENGE_PROOF: Range<usize> = 24..56;
    /// xxh3-64 of every byte before it, in a challenge.
    pub(super) const CHALLENGE_SUM: LeField<u64> = LeField::at(56);
    /// The proof message's proof.
    pub(super) const PROOF: Range<usize> = 8..40;
    /// xxh3-64 of every byte before it, in a proof message.
    pub(super) const PROOF_SUM: LeField<u64> = LeField::at(40);
    const _: () = assert!(tiles(
        super::CHALLENGE_SIZE,
        &[
            MAGIC.range(),
            VERSION.range(),
            RESERVED.range(),
            NONCE,
            CHALLENGE_PROOF,
            CHALLENGE_SUM.range(),
        ]
    ));
    const _: () = assert!(tiles(
        super::PROOF_MESSAGE_SIZE,
        &[
            MAGIC.range(),
            VERSION.range(),
            RESERVED.range(),
            PROOF,
            PROOF_SUM.range(),
        ]
    ));
}

/// What a connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    /// The consensus frames of one shard index (both ends' shard of that
    /// index own the connection).
    Shard(u16),
    /// Client requests forwarded to a primary, and their answers.
    Forward,
}

/// The dialer's greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The cluster the dialer belongs to.
    pub cluster: u128,
    /// The dialer.
    pub from: ReplicaId,
    /// The replica it means to reach.
    pub to: ReplicaId,
    /// What the connection carries.
    pub lane: Lane,
    /// The dialer's shards per replica.
    pub shard_count: u16,
    /// The dialer's boot: a later boot has a larger number.
    pub incarnation: u64,
    /// Fresh for every dial (`auth::fresh_nonce`).
    pub nonce: [u8; NONCE_SIZE],
}

/// The accepter's answer to a hello that passed its checks: its nonce and
/// its proof of the secret over the hello and that nonce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// Fresh for every connection.
    pub nonce: [u8; NONCE_SIZE],
    /// `ClusterKey::accepter_proof`.
    pub proof: [u8; PROOF_SIZE],
}

/// The dialer's proof of the secret over the hello and the challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof(pub [u8; PROOF_SIZE]);

/// Why an accepter refused a hello (or why a hello did not decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The bytes are not a hello of this version.
    Malformed,
    /// The dialer belongs to another cluster.
    WrongCluster,
    /// The hello names another replica as its target.
    NotAddressedToMe,
    /// The dialer is not in this replica's roster (or is this replica).
    UnknownReplica,
    /// The dialer runs another number of shards per replica.
    ShardCountMismatch,
    /// The shard lane names a shard this replica does not have.
    ShardOutOfRange,
    /// For shard lanes the lower id dials; this dialer has the higher.
    WrongDialer,
    /// A connection from a later boot of the dialer is already accepted.
    StaleIncarnation,
    /// The dialer's proof is not the cluster secret's over this
    /// handshake: no secret, another secret, or a recorded handshake.
    Unauthenticated,
}

impl Refusal {
    /// The reason as a metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Malformed => "malformed",
            Self::WrongCluster => "wrong_cluster",
            Self::NotAddressedToMe => "not_addressed_to_me",
            Self::UnknownReplica => "unknown_replica",
            Self::ShardCountMismatch => "shard_count_mismatch",
            Self::ShardOutOfRange => "shard_out_of_range",
            Self::WrongDialer => "wrong_dialer",
            Self::StaleIncarnation => "stale_incarnation",
            Self::Unauthenticated => "unauthenticated",
        }
    }

    fn code(self) -> u8 {
        match self {
            Self::Malformed => 1,
            Self::WrongCluster => 2,
            Self::NotAddressedToMe => 3,
            Self::UnknownReplica => 4,
            Self::ShardCountMismatch => 5,
            Self::ShardOutOfRange => 6,
            Self::WrongDialer => 7,
            Self::StaleIncarnation => 8,
            Self::Unauthenticated => 9,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::Malformed,
            2 => Self::WrongCluster,
            3 => Self::NotAddressedToMe,
            4 => Self::UnknownReplica,
            5 => Self::ShardCountMismatch,
            6 => Self::ShardOutOfRange,
            7 => Self::WrongDialer,
            8 => Self::StaleIncarnation,
            9 => Self::Unauthenticated,
            _ => return None,
        })
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Malformed => "the hello is malformed",
            Self::WrongCluster => "the dialer belongs to another cluster",
            Self::NotAddressedToMe => "the hello is addressed to another replica",
            Self::UnknownReplica => "the dialer is not in the roster",
            Self::ShardCountMismatch => "the replicas run different shard counts",
            Self::ShardOutOfRange => "the shard lane is past the shard count",
            Self::WrongDialer => "the higher replica id dialed a shard lane",
            Self::StaleIncarnation => "a later boot of the dialer is already connected",
            Self::Unauthenticated => "the dialer did not prove the cluster secret",
        })
    }
}

impl std::error::Error for Refusal {}

/// The accepter's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The connection is open; the accepter's incarnation.
    Accepted {
        /// The accepter's boot.
        incarnation: u64,
    },
    /// Refused; the accepter closes the connection.
    Refused(Refusal),
}

/// What the accepter knows to check a hello against.
#[derive(Debug, Clone, Copy)]
pub struct Local<'a> {
    /// This cluster.
    pub cluster: u128,
    /// This replica.
    pub me: ReplicaId,
    /// Every replica id of the roster.
    pub roster: &'a [ReplicaId],
    /// Shards per replica here.
    pub shard_count: u16,
}

impl Hello {
    /// The hello's bytes.
    pub fn encode(&self) -> [u8; HELLO_SIZE] {
        let mut out = [0u8; HELLO_SIZE];
        hello_fields::MAGIC.put(&mut out, HELLO_MAGIC);
        hello_fields::VERSION.put(&mut out, VERSION);
        let (lane, shard) = match self.lane {
            Lane::Shard(index) => (0u8, index),
            Lane::Forward => (1u8, 0),
        };
        hello_fields::LANE.put(&mut out, lane);
        hello_fields::FROM.put(&mut out, self.from.0);
        hello_fields::TO.put(&mut out, self.to.0);
        hello_fields::SHARD.put(&mut out, shard);
        hello_fields::SHARD_COUNT.put(&mut out, self.shard_count);
        hello_fields::CLUSTER.put(&mut out, self.cluster);
        hello_fields::INCARNATION.put(&mut out, self.incarnation);
        out[hello_fields::NONCE].copy_from_slice(&self.nonce);
        let sum = xxh3_64(&out[..hello_fields::SUM.start()]);
        hello_fields::SUM.put(&mut out, sum);
        out
    }

    /// Decodes a hello.
    ///
    /// # Errors
    /// [`Refusal::Malformed`] for anything but the exact layout above.
    pub fn decode(bytes: &[u8]) -> Result<Self, Refusal> {
        let b = <&[u8; HELLO_SIZE]>::try_from(bytes).map_err(|_| Refusal::Malformed)?;
        if hello_fields::SUM.get(b) != xxh3_64(&b[..hello_fields::SUM.start()]) {
            return Err(Refusal::Malformed);
        }
        if hello_fields::MAGIC.get(b) != HELLO_MAGIC || hello_fields::VERSION.get(b) != VERSION {
            return Err(Refusal::Malformed);
        }
        if hello_fields::RESERVED_A.get(b) != 0 || hello_fields::RESERVED_B.get(b) != 0 {
            return Err(Refusal::Malformed);
        }
        let shard = hello_fields::SHARD.get(b);
        let lane = match (hello_fields::LANE.get(b), shard) {
            (0, index) => Lane::Shard(index),
            (1, 0) => Lane::Forward,
            _ => return Err(Refusal::Malformed),
        };
        Ok(Self {
            cluster: hello_fields::CLUSTER.get(b),
            from: ReplicaId(hello_fields::FROM.get(b)),
            to: ReplicaId(hello_fields::TO.get(b)),
            lane,
            shard_count: hello_fields::SHARD_COUNT.get(b),
            incarnation: hello_fields::INCARNATION.get(b),
            nonce: array(&b[hello_fields::NONCE]),
        })
    }

    /// Checks the hello against this replica, in a fixed order, naming
    /// the first failure. Incarnations are checked by the caller, which
    /// holds the connections.
    pub fn check(&self, local: &Local<'_>) -> Result<(), Refusal> {
        if self.cluster != local.cluster {
            return Err(Refusal::WrongCluster);
        }
        if self.to != local.me {
            return Err(Refusal::NotAddressedToMe);
        }
        if self.from == local.me || !local.roster.contains(&self.from) {
            return Err(Refusal::UnknownReplica);
        }
        if self.shard_count != local.shard_count {
            return Err(Refusal::ShardCountMismatch);
        }
        if let Lane::Shard(index) = self.lane {
            if index >= local.shard_count {
                return Err(Refusal::ShardOutOfRange);
            }
            if self.from.0 > local.me.0 {
                return Err(Refusal::WrongDialer);
            }
        }
        Ok(())
    }
}

/// The bytes of a field whose range has the array's length.
fn array<const N: usize>(bytes: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[..N]);
    out
}

impl Challenge {
    /// The challenge's bytes.
    pub fn encode(&self) -> [u8; CHALLENGE_SIZE] {
        let mut out = [0u8; CHALLENGE_SIZE];
        proof_fields::MAGIC.put(&mut out, CHALLENGE_MAGIC);
        proof_fields::VERSION.put(&mut out, VERSION);
        out[proof_fields::NONCE].copy_from_slice(&self.nonce);
        out[proof_fields::CHALLENGE_PROOF].copy_from_slice(&self.proof);
        let sum = xxh3_64(&out[..proof_fields::CHALLENGE_SUM.start()]);
        proof_fields::CHALLENGE_SUM.put(&mut out, sum);
        out
    }

    /// Decodes a challenge.
    ///
    /// # Errors
    /// `Err(())` for anything but the exact layout above.
    #[allow(clippy::result_unit_err)]
    pub fn decode(bytes: &[u8]) -> Result<Self, ()> {
        let b = <&[u8; CHALLENGE_SIZE]>::try_from(bytes).map_err(drop)?;
        if proof_fields::MAGIC.get(b) != CHALLENGE_MAGIC
            || proof_fields::VERSION.get(b) != VERSION
            || proof_fields::RESERVED.get(b) != 0
            || proof_fields::CHALLENGE_SUM.get(b)
                != xxh3_64(&b[..proof_fields::CHALLENGE_SUM.start()])
        {
            return Err(());
        }
        Ok(Self {
            nonce: array(&b[proof_fields::NONCE]),
            proof: array(&b[proof_fields::CHALLENGE_PROOF]),
        })
    }

    /// Whether `bytes` start like a challenge (the dialer reads a
    /// verdict's length first, then the rest of a challenge).
    pub fn starts(bytes: &[u8]) -> bool {
        bytes.get(..4) == Some(&CHALLENGE_MAGIC.to_le_bytes()[..])
    }
}

impl Proof {
    /// The proof message's bytes.
    pub fn encode(&self) -> [u8; PROOF_MESSAGE_SIZE] {
        let mut out = [0u8; PROOF_MESSAGE_SIZE];
        proof_fields::MAGIC.put(&mut out, PROOF_MAGIC);
        proof_fields::VERSION.put(&mut out, VERSION);
        out[proof_fields::PROOF].copy_from_slice(&self.0);
        let sum = xxh3_64(&out[..proof_fields::PROOF_SUM.start()]);
        proof_fields::PROOF_SUM.put(&mut out, sum);
        out
    }

    /// Decodes a proof message.
    ///
    /// # Errors
    /// [`Refusal::Malformed`] for anything but the exact layout above.
    pub fn decode(bytes: &[u8]) -> Result<Self, Refusal> {
        let b = <&[u8; PROOF_MESSAGE_SIZE]>::try_from(bytes).map_err(|_| Refusal::Malformed)?;
        if proof_fields::MAGIC.get(b) != PROOF_MAGIC
            || proof_fields::VERSION.get(b) != VERSION
            || proof_fields::RESERVED.get(b) != 0
            || proof_fields::PROOF_SUM.get(b) != xxh3_64(&b[..proof_fields::PROOF_SUM.start()])
        {
            return Err(Refusal::Malformed);
        }
        Ok(Self(array(&b[proof_fields::PROOF])))
    }
}

impl Verdict {
    /// The verdict's bytes.
    pub fn encode(&self) -> [u8; VERDICT_SIZE] {
        let mut out = [0u8; VERDICT_SIZE];
        verdict_fields::MAGIC.put(&mut out, VERDICT_MAGIC);
        verdict_fields::VERSION.put(&mut out, VERSION);
        match self {
            Self::Accepted { incarnation } => {
                verdict_fields::INCARNATION.put(&mut out, *incarnation)
            }
            Self::Refused(refusal) => verdict_fields::CODE.put(&mut out, refusal.code()),
        }
        let sum = xxh3_64(&out[..verdict_fields::SUM.start()]);
        verdict_fields::SUM.put(&mut out, sum);
        out
    }

    /// Decodes a verdict.
    ///
    /// # Errors
    /// `Err(())` for anything but the exact layout above.
    #[allow(clippy::result_unit_err)]
    pub fn decode(bytes: &[u8]) -> Result<Self, ()> {
        let b = <&[u8; VERDICT_SIZE]>::try_from(bytes).map_err(drop)?;
        if verdict_fields::MAGIC.get(b) != VERDICT_MAGIC
            || verdict_fields::VERSION.get(b) != VERSION
            || verdict_fields::RESERVED.get(b) != 0
        {
            return Err(());
        }
        if verdict_fields::SUM.get(b) != xxh3_64(&b[..verdict_fields::SUM.start()]) {
            return Err(());
        }
        let incarnation = verdict_fields::INCARNATION.get(b);
        match verdict_fields::CODE.get(b) {
            0 => Ok(Self::Accepted { incarnation }),
            code if incarnation == 0 => Refusal::from_code(code).map(Self::Refused).ok_or(()),
            _ => Err(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hello() -> Hello {
        Hello {
            cluster: 0xABCD_0123,
            from: ReplicaId(0),
            to: ReplicaId(2),
            lane: Lane::Shard(1),
            shard_count: 2,
            incarnation: 77,
            nonce: [0x5A; NONCE_SIZE],
        }
    }

    fn local(me: u8) -> Local<'static> {
        const ROSTER: [ReplicaId; 3] = [ReplicaId(0), ReplicaId(1), ReplicaId(2)];
        Local {
            cluster: 0xABCD_0123,
            me: ReplicaId(me),
            roster: &ROSTER,
            shard_count: 2,
        }
    }

    #[test]
    fn given_hellos_and_verdicts_when_encoded_should_decode_to_themselves() {
        for lane in [Lane::Shard(0), Lane::Shard(65_535), Lane::Forward] {
            let h = Hello { lane, ..hello() };
            assert_eq!(Hello::decode(&h.encode()), Ok(h));
        }
        let mut verdicts = vec![Verdict::Accepted { incarnation: 9 }];
        verdicts.extend((1..=9).filter_map(Refusal::from_code).map(Verdict::Refused));
        assert_eq!(verdicts.len(), 10);
        for v in verdicts {
            assert_eq!(Verdict::decode(&v.encode()), Ok(v));
        }
        let c = Challenge {
            nonce: [3; NONCE_SIZE],
            proof: [4; PROOF_SIZE],
        };
        assert_eq!(Challenge::decode(&c.encode()), Ok(c));
        assert!(Challenge::starts(&c.encode()));
        assert!(!Challenge::starts(
            &Verdict::Accepted { incarnation: 1 }.encode()
        ));
        let p = Proof([6; PROOF_SIZE]);
        assert_eq!(Proof::decode(&p.encode()), Ok(p));
    }

    #[test]
    fn given_a_challenge_or_proof_with_any_byte_changed_when_decoded_should_fail_closed() {
        let c = Challenge {
            nonce: [3; NONCE_SIZE],
            proof: [4; PROOF_SIZE],
        }
        .encode();
        for at in 0..CHALLENGE_SIZE {
            let mut bad = c;
            bad[at] ^= 0x10;
            assert_eq!(Challenge::decode(&bad), Err(()), "byte {at}");
        }
        let p = Proof([6; PROOF_SIZE]).encode();
        for at in 0..PROOF_MESSAGE_SIZE {
            let mut bad = p;
            bad[at] ^= 0x10;
            assert_eq!(Proof::decode(&bad), Err(Refusal::Malformed), "byte {at}");
        }
        assert_eq!(Proof::decode(&p[..47]), Err(Refusal::Malformed));
    }

    #[test]
    fn given_a_version_1_hello_when_decoded_should_be_malformed() {
        let mut v1 = hello().encode();
        v1[4..6].copy_from_slice(&1u16.to_le_bytes());
        let sum = xxh3_64(&v1[..56]);
        v1[56..].copy_from_slice(&sum.to_le_bytes());
        assert_eq!(Hello::decode(&v1), Err(Refusal::Malformed));
    }

    #[test]
    fn given_a_hello_with_any_byte_changed_when_decoded_should_be_malformed() {
        let bytes = hello().encode();
        for at in 0..HELLO_SIZE {
            let mut bad = bytes;
            bad[at] ^= 0x40;
            assert_eq!(Hello::decode(&bad), Err(Refusal::Malformed), "byte {at}");
        }
        assert_eq!(Hello::decode(&bytes[..63]), Err(Refusal::Malformed));
        let v = Verdict::Refused(Refusal::WrongCluster).encode();
        for at in 0..VERDICT_SIZE {
            let mut bad = v;
            bad[at] ^= 0x01;
            assert_eq!(Verdict::decode(&bad), Err(()), "byte {at}");
        }
    }

    #[test]
    fn given_each_mismatch_when_checked_should_name_it_in_order() {
        let ok = hello();
        assert_eq!(ok.check(&local(2)), Ok(()));
        let cases = [
            (
                Hello {
                    cluster: 1,
                    to: ReplicaId(1),
                    ..ok
                },
                Refusal::WrongCluster,
            ),
            (
                Hello {
                    to: ReplicaId(1),
                    ..ok
                },
                Refusal::NotAddressedToMe,
            ),
            (
                Hello {
                    from: ReplicaId(7),
                    ..ok
                },
                Refusal::UnknownReplica,
            ),
            (
                Hello {
                    from: ReplicaId(2),
                    ..ok
                },
                Refusal::UnknownReplica,
            ),
            (
                Hello {
                    shard_count: 3,
                    ..ok
                },
                Refusal::ShardCountMismatch,
            ),
            (
                Hello {
                    lane: Lane::Shard(2),
                    ..ok
                },
                Refusal::ShardOutOfRange,
            ),
        ];
        for (h, refusal) in cases {
            assert_eq!(h.check(&local(2)), Err(refusal), "{h:?}");
        }
        // The higher id may not dial a shard lane, but may forward.
        let up = Hello {
            from: ReplicaId(2),
            to: ReplicaId(0),
            ..ok
        };
        assert_eq!(up.check(&local(0)), Err(Refusal::WrongDialer));
        let forward = Hello {
            lane: Lane::Forward,
            ..up
        };
        assert_eq!(forward.check(&local(0)), Ok(()));
    }

    proptest! {
        #[test]
        fn given_random_bytes_when_decoded_should_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Hello::decode(&bytes);
            let _ = Verdict::decode(&bytes);
            let _ = Challenge::decode(&bytes);
            let _ = Proof::decode(&bytes);
        }
    }
}
