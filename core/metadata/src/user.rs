//! Users and their password hashes.
//!
//! Hashing is deliberately outside `apply`: Argon2 is slow by design and
//! salted, so if every replica hashed, every replica would store a
//! different hash and spend the time on its apply path. The primary (the
//! client listener, before proposing) calls [`hash_password`] with a fresh
//! salt; the op carries the PHC string; `apply` only checks that it parses
//! and stores it; login verification ([`verify_password`]) is a query.

use std::fmt;

use argon2::password_hash::{PasswordHash as Phc, SaltString};
use argon2::{Algorithm, Argon2, Params, PasswordHasher, PasswordVerifier, Version};

/// The longest PHC string accepted (Argon2id strings are ~100 bytes).
pub const PASSWORD_HASH_LEN_MAX: usize = 512;

/// The root user's id (Iggy's root user is id 0).
pub const ROOT_USER: UserId = UserId(0);

/// A user's id (from 0; 0 is the root user).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct UserId(pub u32);

/// An Argon2 password hash in PHC string form (`$argon2id$v=19$...`).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PasswordHash(String);

impl fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The hash is not the password, but it is still not for logs.
        f.write_str("PasswordHash(..)")
    }
}

impl PasswordHash {
    /// Wraps a PHC string if it parses as one and fits the ceiling.
    pub fn from_phc(phc: String) -> Result<Self, PasswordError> {
        if phc.is_empty() || phc.len() > PASSWORD_HASH_LEN_MAX {
            return Err(PasswordError::NotPhc);
        }
        Phc::new(&phc).map_err(|_| PasswordError::NotPhc)?;
        Ok(Self(phc))
    }

    /// The PHC string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The id.
    pub id: UserId,
    /// The username, unique.
    pub username: String,
    /// The password hash.
    pub password_hash: PasswordHash,
    /// Creation time in microseconds since the epoch (from the op).
    pub created_at_us: u64,
}

/// Argon2id cost parameters for new hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashParams {
    /// Memory in KiB.
    pub memory_kib: u32,
    /// Iterations.
    pub iterations: u32,
    /// Lanes.
    pub parallelism: u32,
}

impl Default for HashParams {
    /// The argon2 crate's (OWASP-recommended) defaults.
    fn default() -> Self {
        Self {
            memory_kib: Params::DEFAULT_M_COST,
            iterations: Params::DEFAULT_T_COST,
            parallelism: Params::DEFAULT_P_COST,
        }
    }
}

/// Why a password could not be hashed, or a hash not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PasswordError {
    /// The cost parameters are outside what Argon2 allows.
    BadParams,
    /// Hashing failed (the password is longer than Argon2 takes).
    HashFailed,
    /// The string is not an Argon2 PHC hash within the length ceiling.
    NotPhc,
}

impl fmt::Display for PasswordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::BadParams => "the Argon2 cost parameters are invalid",
            Self::HashFailed => "the password could not be hashed",
            Self::NotPhc => "not an Argon2 PHC hash string",
        })
    }
}

impl std::error::Error for PasswordError {}

/// Hashes `password` with Argon2id and the given 16-byte salt. The caller
/// draws the salt from the OS's randomness; tests pass fixed salts.
pub fn hash_password(
    password: &str,
    salt: &[u8; 16],
    params: HashParams,
) -> Result<PasswordHash, PasswordError> {
    let params = Params::new(
        params.memory_kib,
        params.iterations,
        params.parallelism,
        None,
    )
    .map_err(|_| PasswordError::BadParams)?;
    let salt = SaltString::encode_b64(salt).map_err(|_| PasswordError::HashFailed)?;
    let phc = Argon2::new(Algorithm::Argon2id, Version::V0x13, params)
        .hash_password(password.as_bytes(), &salt)
        .map_err(|_| PasswordError::HashFailed)?
        .to_string();
    PasswordHash::from_phc(phc)
}

/// Whether `password` matches `hash` (the hash's own parameters are used).
pub fn verify_password(hash: &PasswordHash, password: &str) -> bool {
    let Ok(parsed) = Phc::new(hash.as_str()) else {
        return false;
    };
    Argon2::default()
        .verify_password(password.as_bytes(), &parsed)
        .is_ok()
}
