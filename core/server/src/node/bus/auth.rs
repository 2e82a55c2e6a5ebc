//! Peer authentication on the replica bus: every replica of a roster holds
//! the cluster secret, and both ends of a connection prove it before the
//! accepter routes the connection anywhere (docs/operations.md
//! "Security", docs/formats.md §14).
//!
//! The proofs are keyed BLAKE2b-256 MACs (BLAKE2 is a MAC when keyed; no
//! HMAC construction is needed) over the whole transcript so far, with a
//! label per direction:
//!
//! - the dialer's hello carries a fresh nonce of its own;
//! - the accepter answers with a fresh nonce and its proof over the hello
//!   and that nonce: the dialer learns the accepter knows the secret, and
//!   an old answer cannot be replayed to it (its nonce is new);
//! - the dialer answers with its proof over the hello, the accepter's
//!   nonce and proof: a recorded handshake replayed to an accepter fails,
//!   because the accepter's nonce is new.
//!
//! The key is a BLAKE2b-256 hash of the secret, so a secret of any length
//! fits the MAC's key. Neither the secret nor the key is ever printed.

use std::fmt;
use std::io::Read;

use blake2::Blake2bMac;
use blake2::digest::Mac;
use blake2::digest::consts::U32;

/// Bytes of a nonce.
pub const NONCE_SIZE: usize = 16;
/// Bytes of a proof.
pub const PROOF_SIZE: usize = 32;
/// The shortest secret accepted, in bytes.
pub const SECRET_LEN_MIN: usize = 32;

/// Persona of the key derivation (at most 16 bytes).
const KEY_PERSONA: &[u8] = b"replog-secret-v1";
/// Persona of the handshake MACs.
const MAC_PERSONA: &[u8] = b"replog-bus-v2";
/// What the accepter's proof is labelled with.
const ACCEPTER_LABEL: &[u8] = b"accepter";
/// What the dialer's proof is labelled with.
const DIALER_LABEL: &[u8] = b"dialer";

/// The key every replica of a cluster derives from the cluster secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterKey([u8; 32]);

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// A secret that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretError {
    /// Shorter than [`SECRET_LEN_MIN`] bytes once surrounding whitespace is
    /// trimmed.
    TooShort {
        /// Its length.
        len: usize,
    },
}

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooShort { len } => write!(
                f,
                "the cluster secret has {len} bytes; at least {SECRET_LEN_MIN} are needed \
                 (`replog secret` prints a fresh one)"
            ),
        }
    }
}

impl std::error::Error for SecretError {}

fn mac(key: &[u8], persona: &[u8]) -> Blake2bMac<U32> {
    // Both lengths are within BLAKE2b's limits (key ≤ 64, persona ≤ 16).
    match Blake2bMac::<U32>::new_with_salt_and_personal(key, &[], persona) {
        Ok(m) => m,
        Err(_) => unreachable!("constant key and persona lengths fit BLAKE2b"),
    }
}

impl ClusterKey {
    /// The key of `secret` (surrounding whitespace trimmed, so a file's
    /// trailing newline does not count).
    ///
    /// # Errors
    /// [`SecretError::TooShort`] below [`SECRET_LEN_MIN`] bytes.
    pub fn from_secret(secret: &[u8]) -> Result<Self, SecretError> {
        let secret = secret.trim_ascii();
        if secret.len() < SECRET_LEN_MIN {
            return Err(SecretError::TooShort { len: secret.len() });
        }
        let mut m = mac(&[], KEY_PERSONA);
        m.update(secret);
        Ok(Self(m.finalize().into_bytes().into()))
    }

    /// The MAC state over a label and length-prefixed parts (so no part
    /// can be shifted into the next).
    fn transcript(&self, label: &[u8], parts: &[&[u8]]) -> Blake2bMac<U32> {
        let mut m = mac(&self.0, MAC_PERSONA);
        m.update(label);
        for part in parts {
            m.update(&(part.len() as u64).to_le_bytes());
            m.update(part);
        }
        m
    }

    fn prove(&self, label: &[u8], parts: &[&[u8]]) -> [u8; PROOF_SIZE] {
        self.transcript(label, parts).finalize().into_bytes().into()
    }

    /// Compares in constant time.
    fn check(&self, label: &[u8], parts: &[&[u8]], proof: &[u8; PROOF_SIZE]) -> bool {
        self.transcript(label, parts).verify_slice(proof).is_ok()
    }

    /// The accepter's proof over the dialer's hello bytes and its own
    /// nonce.
    pub fn accepter_proof(&self, hello: &[u8], nonce: &[u8; NONCE_SIZE]) -> [u8; PROOF_SIZE] {
        self.prove(ACCEPTER_LABEL, &[hello, nonce])
    }

    /// Whether an accepter's proof is right.
    pub fn check_accepter(
        &self,
        hello: &[u8],
        nonce: &[u8; NONCE_SIZE],
        proof: &[u8; PROOF_SIZE],
    ) -> bool {
        self.check(ACCEPTER_LABEL, &[hello, nonce], proof)
    }

    /// The dialer's proof over its hello and the accepter's challenge
    /// (nonce and proof).
    pub fn dialer_proof(
        &self,
        hello: &[u8],
        nonce: &[u8; NONCE_SIZE],
        accepter: &[u8; PROOF_SIZE],
    ) -> [u8; PROOF_SIZE] {
        self.prove(DIALER_LABEL, &[hello, nonce, accepter])
    }

    /// Whether a dialer's proof is right.
    pub fn check_dialer(
        &self,
        hello: &[u8],
        nonce: &[u8; NONCE_SIZE],
        accepter: &[u8; PROOF_SIZE],
        proof: &[u8; PROOF_SIZE],
    ) -> bool {
        self.check(DIALER_LABEL, &[hello, nonce, accepter], proof)
    }
}

/// A fresh nonce from the kernel's random source.
///
/// # Errors
/// The I/O error reading `/dev/urandom`.
pub fn fresh_nonce() -> std::io::Result<[u8; NONCE_SIZE]> {
    let mut nonce = [0u8; NONCE_SIZE];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut nonce)?;
    Ok(nonce)
}

/// A fresh secret, hex-encoded (64 characters), for `replog secret` and
/// `replog dev`.
///
/// # Errors
/// The I/O error reading `/dev/urandom`.
pub fn fresh_secret() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    #[test]
    fn given_short_secrets_when_keyed_should_refuse_them() {
        assert_eq!(
            ClusterKey::from_secret(b"  short\n"),
            Err(SecretError::TooShort { len: 5 })
        );
        assert!(ClusterKey::from_secret(SECRET).is_ok());
        let trailing: Vec<u8> = [SECRET, b"\n"].concat();
        assert_eq!(
            ClusterKey::from_secret(&trailing).unwrap(),
            ClusterKey::from_secret(SECRET).unwrap(),
            "a file's newline is not part of the secret"
        );
        assert_eq!(
            format!("{:?}", ClusterKey::from_secret(SECRET).unwrap()),
            "ClusterKey(..)"
        );
    }

    #[test]
    fn given_proofs_when_checked_should_hold_only_for_the_same_key_transcript_and_side() {
        let key = ClusterKey::from_secret(SECRET).unwrap();
        let other = ClusterKey::from_secret(b"0123456789abcdef0123456789abcdeF").unwrap();
        let hello = [7u8; 64];
        let nonce = [1u8; NONCE_SIZE];
        let a = key.accepter_proof(&hello, &nonce);
        assert!(key.check_accepter(&hello, &nonce, &a));
        assert!(!other.check_accepter(&hello, &nonce, &a), "another secret");
        assert!(
            !key.check_accepter(&hello, &[2u8; NONCE_SIZE], &a),
            "another nonce"
        );
        let mut changed = hello;
        changed[9] ^= 1;
        assert!(!key.check_accepter(&changed, &nonce, &a), "another hello");
        let d = key.dialer_proof(&hello, &nonce, &a);
        assert!(key.check_dialer(&hello, &nonce, &a, &d));
        assert_ne!(a, d, "the two sides' proofs differ");
        assert!(
            !key.check_dialer(&hello, &nonce, &a, &a),
            "a reflected proof"
        );
        assert!(
            !key.check_dialer(&hello, &[3u8; NONCE_SIZE], &a, &d),
            "a replay under a new nonce"
        );
    }

    #[test]
    fn given_two_fresh_nonces_should_differ() {
        assert_ne!(fresh_nonce().unwrap(), fresh_nonce().unwrap());
        let s = fresh_secret().unwrap();
        assert_eq!(s.len(), 64);
        assert!(ClusterKey::from_secret(s.as_bytes()).is_ok());
    }
}
