//! The open-file budget. A partition group in use holds a few descriptors
//! (its active segment's log and index files, and at most one cached
//! reader of a sealed segment; the superblock is opened only to be
//! written); an idle one holds none once its shard's handle pass has seen
//! it (within about 5 s). A replica may host thousands of groups and use
//! many at once, so a soft limit of 1,024 would stop one long before its
//! hard limit would. At start the soft limit is raised to the hard one,
//! and the log says what it is.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Descriptors a partition group in use holds at most (see the module
/// documentation; an idle group's are closed).
pub const DESCRIPTORS_PER_GROUP: u64 = 3;

/// The open-file limit before and after [`raise_open_file_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFileLimit {
    /// The soft limit found at start (`None`: unlimited).
    pub before: Option<u64>,
    /// The soft limit in force now.
    pub now: Option<u64>,
}

impl OpenFileLimit {
    /// Partition groups in use at once the limit leaves room for, past
    /// `reserved` descriptors for sockets, the metadata plane and the
    /// runtime.
    pub fn groups_room(&self, reserved: u64) -> Option<u64> {
        self.now
            .map(|n| n.saturating_sub(reserved) / DESCRIPTORS_PER_GROUP)
    }
}

/// Raises the soft open-file limit to the hard limit.
///
/// # Errors
/// The kernel's refusal; the limit is then left as it was.
pub fn raise_open_file_limit() -> std::io::Result<OpenFileLimit> {
    let limit = getrlimit(Resource::Nofile);
    let before = limit.current;
    if limit.current == limit.maximum {
        return Ok(OpenFileLimit {
            before,
            now: before,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        },
    )?;
    Ok(OpenFileLimit {
        before,
        now: getrlimit(Resource::Nofile).current,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn given_the_process_limit_when_raised_should_equal_the_hard_limit() {
        let raised = raise_open_file_limit().unwrap();
        assert_eq!(raised.now, getrlimit(Resource::Nofile).maximum);
        // A second raise finds nothing to do.
        let again = raise_open_file_limit().unwrap();
        assert_eq!((again.before, again.now), (raised.now, raised.now));
    }

    #[test]
    fn given_a_limit_when_asked_for_room_should_leave_the_reserve() {
        let l = OpenFileLimit {
            before: Some(1024),
            now: Some(20_000),
        };
        assert_eq!(l.groups_room(500), Some(6_500));
        assert_eq!(
            OpenFileLimit {
                before: None,
                now: None
            }
            .groups_room(500),
            None
        );
    }
}
