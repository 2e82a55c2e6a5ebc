//! The fence: when an install can neither finish nor converge, the
//! partition refuses every input and its segment files are moved aside as
//! evidence; and the converge (ST-I5) that a failed mutate phase tries
//! first, to the empty, honestly lagging shape boot would produce.

use common::Op;
use std::io;
use std::path::{Path, PathBuf};

use journal::SuperblockStore;
use storage::SegmentedLog;
use storage::fs::Fs;

use super::check::CheckedInstall;
use super::{remove_if_present, segment_files};
use crate::bus::MessageBus;
use crate::partition::Partition;

/// Moves every `.log`, `.index` and `.staging` file of `dir` into
/// `<dir>.fenced.<n>` (the first `n` in `0..1000` whose directory
/// `create_dir` could create, so an earlier fence is never merged into),
/// then syncs the target, `dir` and their parent. The superblock, the
/// install marker, `purge.gen` and the offsets stay: the superblock is the
/// group's only durable view and frontier, and a rebuild over this
/// directory reads it. Returns the target directory.
///
/// The fenced files are evidence for an operator; nothing reads them again
/// (recovery only looks at files directly in `dir`).
///
/// # Errors
/// The underlying I/O error. The files may then be split between the two
/// directories; the caller leaves the partition fenced and rebuilds
/// nothing over it.
pub async fn fence_partition<F: Fs>(fs: &F, dir: &Path) -> io::Result<PathBuf> {
    let mut target = None;
    for n in 0..1000 {
        let mut name = dir.as_os_str().to_os_string();
        name.push(format!(".fenced.{n}"));
        let candidate = PathBuf::from(name);
        match fs.create_dir(&candidate).await {
            Ok(()) => {
                target = Some(candidate);
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    let Some(target) = target else {
        return Err(io::Error::other(
            "a thousand fenced copies of this partition already exist",
        ));
    };
    for path in segment_files(fs, dir).await? {
        let Some(name) = path.file_name() else {
            continue;
        };
        fs.rename(&path, &target.join(name)).await?;
    }
    // The target's entries, the source's removals, and the target's own
    // name in the parent: without all three a crash could leave a moved
    // file linked in neither directory.
    fs.sync_dir(&target).await?;
    fs.sync_dir(dir).await?;
    if let Some(parent) = dir.parent() {
        fs.sync_dir(parent).await?;
    }
    tracing::error!(dir = %dir.display(), target = %target.display(), "partition segment files fenced");
    Ok(target)
}

impl<B: MessageBus, S: SuperblockStore, F: Fs> Partition<B, S, F> {
    /// Quarantines this partition's segment files (see [`fence_partition`])
    /// and fences it in memory. For the caller after `ConvergeFailed`.
    ///
    /// # Errors
    /// The quarantine's I/O error; the partition stays fenced either way.
    pub async fn fence_segment_files(&mut self, reason: &str) -> io::Result<PathBuf> {
        self.health.fence(|| reason.to_owned());
        fence_partition(&self.fs, &self.dir).await
    }

    /// ST-I5: disk and memory to an empty partition at the frontier, with
    /// no offsets and no dedup, applied at the install's op (the
    /// superblock already says so), so its next offset and its op numbers
    /// agree with the group's. It is honestly lagging: it holds none of the
    /// history below the frontier, so the core stays in its transfer
    /// (quorum-invisible, `state_transfer_needed` still reported when it
    /// was) and the driver pulls again; if the core's transfer timer runs
    /// out first, it repairs the tail above the installed op as usual.
    pub(super) async fn converge_after_failed_install(
        &mut self,
        checked: &CheckedInstall,
    ) -> io::Result<()> {
        let dir = self.dir.clone();
        let fs = self.fs.clone();
        // Whatever the failure left: the old chain, a prefix of the new
        // one, staging files. Only the directory knows.
        for path in segment_files(&fs, &dir).await? {
            remove_if_present(&fs, &path).await?;
        }
        fs.sync_dir(&dir).await?;
        let (log, _) = SegmentedLog::open(fs.clone(), &dir, self.config.log, checked.frontier)
            .await
            .map_err(|e| io::Error::other(e.to_string()))?;
        self.replace_log(log);
        self.offsets.clear_all(&fs).await?;
        self.journal.clear_all(Op(checked.commit_op + 1));
        self.count_replaced_log(0, 0, 0);
        // Watermarks of data this replica no longer holds could swallow a
        // replay; at-least-once until the next install.
        if let Err(error) = self.replica.client_table_mut().install(&[]) {
            tracing::warn!(%error, "could not clear the dedup table on converge");
        }
        self.lift_to_installed_point(checked, None, false);
        self.record_missing_history(checked).await;
        if let Err(error) = self.drive().await {
            tracing::warn!(dir = %self.dir.display(), %error, "driving the core after a converge failed");
        }
        tracing::warn!(dir = %dir.display(), frontier = checked.frontier, "partition converged to empty after a failed install");
        Ok(())
    }
}
