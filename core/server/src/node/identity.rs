//! The data directory's identity: which cluster, replica and shard count
//! it was laid out for. Recorded on first start; every later start
//! refuses a directory that belongs to another cluster or replica, or was
//! laid out for another shard count (groups would be looked for on the
//! wrong shards).
//!
//! `replica.id` holds: magic `RPLI`, version 1, cluster u128, replica u8,
//! shard count u16, all little-endian, then an xxh3-64 trailer. It is
//! written to a sibling, synced, renamed into place and the directory
//! synced, so a crash leaves either no identity (the next start records
//! it) or the whole one.

use std::fs;
use std::io::Write;
use std::path::Path;

use common::le_cursor::{LeField, tiles};
use xxhash_rust::xxh3::xxh3_64;

use super::NodeConfig;

const FILE: &str = "replica.id";
/// "RPLI" as a little-endian u32.
const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"RPLI");

// The record's fields, each declared once for the encoder and the decoder.
const MAGIC: LeField<u32> = LeField::at(0);
const VERSION: LeField<u8> = LeField::at(4);
const CLUSTER: LeField<u128> = LeField::at(5);
const REPLICA: LeField<u8> = LeField::at(21);
const SHARD_COUNT: LeField<u16> = LeField::at(22);
/// xxh3-64 of every byte before it.
const SUM: LeField<u64> = LeField::at(24);
const _: () = assert!(tiles(
    SUM.end(),
    &[
        MAGIC.range(),
        VERSION.range(),
        CLUSTER.range(),
        REPLICA.range(),
        SHARD_COUNT.range(),
        SUM.range(),
    ]
));

/// What a data directory was laid out for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    /// The cluster id.
    pub cluster: u128,
    /// The replica id.
    pub replica: u8,
    /// Shards per replica.
    pub shard_count: u16,
}

/// The identity a configuration asks for.
pub fn of(config: &NodeConfig) -> Identity {
    Identity {
        cluster: config.cluster,
        replica: config.replica.0,
        shard_count: config.shard_count,
    }
}

impl Identity {
    fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; SUM.end()];
        MAGIC.put(&mut out, RECORD_MAGIC);
        VERSION.put(&mut out, 1);
        CLUSTER.put(&mut out, self.cluster);
        REPLICA.put(&mut out, self.replica);
        SHARD_COUNT.put(&mut out, self.shard_count);
        let sum = xxh3_64(&out[..SUM.start()]);
        SUM.put(&mut out, sum);
        out
    }

    fn decode(bytes: &[u8]) -> Result<Self, String> {
        let Ok(b) = <&[u8; SUM.end()]>::try_from(bytes) else {
            return Err(format!("{} bytes, expected {}", bytes.len(), SUM.end()));
        };
        if SUM.get(b) != xxh3_64(&b[..SUM.start()]) {
            return Err("checksum mismatch".into());
        }
        if MAGIC.get(b) != RECORD_MAGIC || VERSION.get(b) != 1 {
            return Err("not a replica identity of version 1".into());
        }
        Ok(Self {
            cluster: CLUSTER.get(b),
            replica: REPLICA.get(b),
            shard_count: SHARD_COUNT.get(b),
        })
    }
}

/// Records `wanted` in a new data directory, or checks that an existing
/// one was laid out for it.
///
/// # Errors
/// A sentence for the operator naming the directory and the mismatch.
pub fn check_or_record(data_dir: &Path, wanted: &Identity) -> Result<(), String> {
    if check(data_dir, wanted)? {
        Ok(())
    } else {
        record(data_dir, wanted)
    }
}

/// Checks the recorded identity against `wanted`: `Ok(true)` when it
/// matches, `Ok(false)` when none is recorded (a data directory this
/// replica never started in).
///
/// # Errors
/// A sentence naming the mismatch or the unreadable file.
pub fn check(data_dir: &Path, wanted: &Identity) -> Result<bool, String> {
    let path = data_dir.join(FILE);
    match fs::read(&path) {
        Ok(bytes) => {
            let found = Identity::decode(&bytes)
                .map_err(|e| format!("{}: unreadable replica identity: {e}", path.display()))?;
            if found.cluster != wanted.cluster {
                return Err(format!(
                    "{} belongs to cluster {:#x}, this replica is configured for cluster {:#x}; refusing to start",
                    data_dir.display(),
                    found.cluster,
                    wanted.cluster
                ));
            }
            if found.replica != wanted.replica {
                return Err(format!(
                    "{} belongs to replica {}, this process is configured as replica {}; refusing to start",
                    data_dir.display(),
                    found.replica,
                    wanted.replica
                ));
            }
            if found.shard_count != wanted.shard_count {
                return Err(format!(
                    "{} was laid out for {} shards, the configuration asks for {}; groups would be looked for on the wrong shards, refusing to start",
                    data_dir.display(),
                    found.shard_count,
                    wanted.shard_count
                ));
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Records `wanted` durably (sibling, sync, rename, directory sync).
///
/// # Errors
/// A sentence naming the step that failed.
pub fn record(data_dir: &Path, wanted: &Identity) -> Result<(), String> {
    let io = |step: &str, e: std::io::Error| format!("{}: {step}: {e}", data_dir.display());
    fs::create_dir_all(data_dir).map_err(|e| io("creating the data directory", e))?;
    let path = data_dir.join(FILE);
    let sibling = data_dir.join(format!("{FILE}.new"));
    let mut file = fs::File::create(&sibling).map_err(|e| io("creating the identity", e))?;
    file.write_all(&wanted.encode())
        .map_err(|e| io("writing the identity", e))?;
    file.sync_all().map_err(|e| io("syncing the identity", e))?;
    drop(file);
    fs::rename(&sibling, &path).map_err(|e| io("renaming the identity into place", e))?;
    fs::File::open(data_dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("syncing the data directory", e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn id() -> Identity {
        Identity {
            cluster: 7,
            replica: 1,
            shard_count: 2,
        }
    }

    #[test]
    fn given_new_directory_when_checked_should_record_then_accept_the_same_identity() {
        let dir = tempfile::tempdir().unwrap();
        check_or_record(dir.path(), &id()).unwrap();
        check_or_record(dir.path(), &id()).unwrap();
    }

    #[test]
    fn given_directory_of_another_cluster_replica_or_shard_count_should_refuse() {
        let dir = tempfile::tempdir().unwrap();
        check_or_record(dir.path(), &id()).unwrap();
        for other in [
            Identity { cluster: 8, ..id() },
            Identity { replica: 2, ..id() },
            Identity {
                shard_count: 4,
                ..id()
            },
        ] {
            let err = check_or_record(dir.path(), &other).unwrap_err();
            assert!(err.contains("refusing to start"), "{err}");
        }
    }

    #[test]
    fn given_damaged_identity_when_checked_should_refuse() {
        let dir = tempfile::tempdir().unwrap();
        check_or_record(dir.path(), &id()).unwrap();
        let path = dir.path().join(FILE);
        let mut bytes = fs::read(&path).unwrap();
        bytes[6] ^= 1;
        fs::write(&path, bytes).unwrap();
        assert!(check_or_record(dir.path(), &id()).is_err());
    }
}
