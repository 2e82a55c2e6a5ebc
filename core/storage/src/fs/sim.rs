//! The simulated filesystem: in memory, single-threaded, deterministic from
//! a seed, with crashes that keep only what a real disk must keep.
//!
//! Model (honest to POSIX on ext4, not kinder):
//! - A file is an inode with **durable** bytes (as of its last
//!   `sync_data`/`sync_all`) and the **volatile** writes and `set_len`s
//!   issued since, kept in order. A crash replays a seeded choice of those
//!   on top of the durable bytes: none, all, a prefix of them whose last
//!   write may land only partly (a torn tail), or each one independently
//!   (writeback reorders pages).
//! - A directory maps names to inodes. Creates, renames and unlinks are
//!   volatile metadata operations until the directory is synced; syncing a
//!   file never makes its name durable. A crash keeps each pending metadata
//!   operation or not, by seed, in issue order; a rename survives or is
//!   undone as a whole.
//! - After a crash every handle opened before it is stale (EIO): the
//!   process that held it is gone.
//! - Directory listings come back in a seeded random order, as a real
//!   filesystem promises no order.
//!
//! Every future completes on its first poll, so tests drive it with
//! `futures::executor::block_on` and need no runtime. Fault injection arms
//! "fail the Nth call of a kind" with a real errno, torn writes, short
//! reads, and bit rot in a stored byte.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Component, Path};
use std::rc::Rc;
use std::time::Duration;

use common::Prng;
use compio::buf::{BufResult, IoBuf};

use super::{DirEntry, EIO, FileKind, Fs, FsFile, Metadata, OpenOptions, errno_error};

const ENOENT: i32 = 2;
const EBADF: i32 = 9;
const EEXIST: i32 = 17;
const ENOTDIR: i32 = 20;
const EISDIR: i32 = 21;
const EINVAL: i32 = 22;
const ENOTEMPTY: i32 = 39;
const EFBIG: i32 = 27;

/// Largest file the simulator holds (it lives in memory).
const SIM_FILE_BYTES_MAX: u64 = 1 << 34;

/// The kinds of call a fault can be armed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// `open` (and `create_dir`, which also creates a name).
    Open,
    /// `read_at`.
    Read,
    /// `write_at` and `set_len`.
    Write,
    /// `sync_data`, `sync_all` and `sync_dir`.
    Sync,
    /// `rename`.
    Rename,
    /// `remove_file` and `remove_dir`.
    Remove,
    /// `read_dir`.
    ReadDir,
}

const FAULT_KINDS: usize = 7;

impl FaultKind {
    const fn index(self) -> usize {
        match self {
            Self::Open => 0,
            Self::Read => 1,
            Self::Write => 2,
            Self::Sync => 3,
            Self::Rename => 4,
            Self::Remove => 5,
            Self::ReadDir => 6,
        }
    }
}

/// Which volatile state a simulated crash keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashMode {
    /// Each file's and each directory's volatile operations are kept or
    /// lost as the seed decides (the power-loss case).
    Seeded,
    /// Everything issued survives (a process crash: the page cache lives).
    KeepAll,
    /// Only synced state survives.
    DropAll,
}

#[derive(Debug, Clone, Copy)]
enum Fault {
    Errno(i32),
    /// The write lands only its first `keep` bytes, then fails with EIO.
    Torn {
        keep: usize,
    },
    /// The read returns at most `max` bytes.
    Short {
        max: usize,
    },
}

#[derive(Debug, Clone, Copy)]
struct ArmedFault {
    kind: FaultKind,
    /// Absolute call number (1-based) of that kind that trips it.
    at_call: u64,
    fault: Fault,
}

#[derive(Debug, Clone)]
enum DataOp {
    Write { pos: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Clone, Default)]
struct FileNode {
    durable: Vec<u8>,
    current: Vec<u8>,
    pending: Vec<DataOp>,
}

#[derive(Debug, Clone, Default)]
struct DirNode {
    durable: BTreeMap<OsString, u64>,
    current: BTreeMap<OsString, u64>,
}

#[derive(Debug, Clone)]
enum Inode {
    File(FileNode),
    Dir(DirNode),
}

#[derive(Debug, Clone)]
enum MetaOp {
    Link {
        dir: u64,
        name: OsString,
        ino: u64,
    },
    Unlink {
        dir: u64,
        name: OsString,
    },
    Rename {
        from_dir: u64,
        from_name: OsString,
        to_dir: u64,
        to_name: OsString,
        ino: u64,
    },
}

impl MetaOp {
    fn touches(&self, d: u64) -> bool {
        match self {
            Self::Link { dir, .. } | Self::Unlink { dir, .. } => *dir == d,
            Self::Rename {
                from_dir, to_dir, ..
            } => *from_dir == d || *to_dir == d,
        }
    }
}

const ROOT: u64 = 0;

#[derive(Debug)]
struct State {
    rng: Prng,
    inodes: BTreeMap<u64, Inode>,
    next_ino: u64,
    pending_meta: Vec<MetaOp>,
    epoch: u64,
    calls: [u64; FAULT_KINDS],
    faults: Vec<ArmedFault>,
    now: Duration,
    crashes: u64,
    /// Calls of any kind counted by `tick` so far.
    total_calls: u64,
    /// After this many calls every call fails with EIO (the power is out).
    power_cut_at: Option<u64>,
    /// `yield_now` returns `Pending` once, as on a real runtime.
    yielding: bool,
    /// Every sync suspends 1 to [`SLOW_SYNC_SUSPENDS_MAX`] times (drawn)
    /// before it completes, as a real disk's takes its time: other tasks
    /// of the caller's executor run meanwhile, more of them the longer
    /// the sync.
    slow_syncs: bool,
    /// A full disk, while set: how many more bytes files may grow by, and
    /// the errno a write past that fails with ([`SimFs::fill_disk`]).
    space: Option<SpaceLimit>,
}

/// What is left of a disk the test filled.
#[derive(Debug, Clone, Copy)]
struct SpaceLimit {
    room_bytes: u64,
    errno: i32,
}

impl SpaceLimit {
    /// A file of `len` bytes grows to `new_len`: takes the growth from the
    /// room and returns how much of it fits (all of it when shrinking,
    /// which gives the bytes back).
    fn take(&mut self, len: u64, new_len: u64) -> u64 {
        if new_len <= len {
            self.room_bytes = self.room_bytes.saturating_add(len - new_len);
            return 0;
        }
        let fits = (new_len - len).min(self.room_bytes);
        self.room_bytes -= fits;
        fits
    }
}

/// The most times one slow sync suspends.
const SLOW_SYNC_SUSPENDS_MAX: u64 = 4;

/// Suspends `times` times, waking itself each time.
async fn suspend(times: u64) {
    for _ in 0..times {
        super::YieldNow::default().await;
    }
}

/// The simulated filesystem. Cloning shares the same state (`Rc`), so a
/// test can keep a handle, crash it, and reopen through the same value.
#[derive(Debug, Clone)]
pub struct SimFs {
    state: Rc<RefCell<State>>,
}

/// An open file of a [`SimFs`].
#[derive(Debug)]
pub struct SimFile {
    state: Rc<RefCell<State>>,
    ino: u64,
    epoch: u64,
    readable: bool,
    writable: bool,
}

fn err(errno: i32) -> io::Error {
    errno_error(errno)
}

fn apply_op(content: &mut Vec<u8>, op: &DataOp) {
    match op {
        DataOp::Write { pos, data } => write_into(content, *pos, data),
        DataOp::SetLen(len) => content.resize(usize_len(*len), 0),
    }
}

fn usize_len(len: u64) -> usize {
    usize::try_from(len).unwrap_or(usize::MAX)
}

fn write_into(content: &mut Vec<u8>, pos: u64, data: &[u8]) {
    let pos = usize_len(pos);
    let end = pos + data.len();
    if content.len() < end {
        content.resize(end, 0);
    }
    content[pos..end].copy_from_slice(data);
}

impl State {
    /// How many times the next sync suspends: none on a fast disk (and no
    /// draw), 1 to [`SLOW_SYNC_SUSPENDS_MAX`] on a slow one.
    fn sync_suspends(&mut self) -> u64 {
        if self.slow_syncs {
            1 + self.rng.below(SLOW_SYNC_SUSPENDS_MAX)
        } else {
            0
        }
    }

    fn tick(&mut self, kind: FaultKind) -> Option<Fault> {
        self.total_calls += 1;
        if self.power_cut_at.is_some_and(|at| self.total_calls > at) {
            return Some(Fault::Errno(EIO));
        }
        let i = kind.index();
        self.calls[i] += 1;
        let call = self.calls[i];
        let hit = self
            .faults
            .iter()
            .position(|f| f.kind == kind && f.at_call == call)?;
        Some(self.faults.remove(hit).fault)
    }

    fn dir(&self, ino: u64) -> io::Result<&DirNode> {
        match self.inodes.get(&ino) {
            Some(Inode::Dir(d)) => Ok(d),
            Some(Inode::File(_)) => Err(err(ENOTDIR)),
            None => Err(err(ENOENT)),
        }
    }

    fn dir_mut(&mut self, ino: u64) -> io::Result<&mut DirNode> {
        match self.inodes.get_mut(&ino) {
            Some(Inode::Dir(d)) => Ok(d),
            Some(Inode::File(_)) => Err(err(ENOTDIR)),
            None => Err(err(ENOENT)),
        }
    }

    fn file_mut(&mut self, ino: u64) -> io::Result<&mut FileNode> {
        match self.inodes.get_mut(&ino) {
            Some(Inode::File(f)) => Ok(f),
            Some(Inode::Dir(_)) => Err(err(EISDIR)),
            None => Err(err(ENOENT)),
        }
    }

    fn names(path: &Path) -> io::Result<Vec<&OsStr>> {
        let mut out = Vec::new();
        for c in path.components() {
            match c {
                Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
                Component::Normal(n) => out.push(n),
                Component::ParentDir => return Err(err(EINVAL)),
            }
        }
        Ok(out)
    }

    fn resolve(&self, path: &Path) -> io::Result<u64> {
        let mut ino = ROOT;
        for name in Self::names(path)? {
            ino = *self
                .dir(ino)?
                .current
                .get(name)
                .ok_or_else(|| err(ENOENT))?;
        }
        Ok(ino)
    }

    /// The parent directory's inode and the final name of `path`.
    fn parent_of(&self, path: &Path) -> io::Result<(u64, OsString)> {
        let names = Self::names(path)?;
        let (last, parents) = names.split_last().ok_or_else(|| err(EINVAL))?;
        let mut ino = ROOT;
        for name in parents {
            ino = *self
                .dir(ino)?
                .current
                .get(*name)
                .ok_or_else(|| err(ENOENT))?;
        }
        self.dir(ino)?;
        Ok((ino, (*last).to_os_string()))
    }

    fn alloc(&mut self, node: Inode) -> u64 {
        let ino = self.next_ino;
        self.next_ino += 1;
        self.inodes.insert(ino, node);
        ino
    }

    fn link(&mut self, dir: u64, name: OsString, ino: u64) -> io::Result<()> {
        self.dir_mut(dir)?.current.insert(name.clone(), ino);
        self.pending_meta.push(MetaOp::Link { dir, name, ino });
        Ok(())
    }

    fn apply_meta_durable(&mut self, op: &MetaOp) {
        match op {
            MetaOp::Link { dir, name, ino } => {
                if let Ok(d) = self.dir_mut(*dir) {
                    d.durable.insert(name.clone(), *ino);
                }
            }
            MetaOp::Unlink { dir, name } => {
                if let Ok(d) = self.dir_mut(*dir) {
                    d.durable.remove(name);
                }
            }
            MetaOp::Rename {
                from_dir,
                from_name,
                to_dir,
                to_name,
                ino,
            } => {
                if let Ok(d) = self.dir_mut(*from_dir) {
                    // Only unlink the source if it still names this inode in
                    // the durable image (a later create may have reused it).
                    if d.durable.get(from_name) == Some(ino) {
                        d.durable.remove(from_name);
                    }
                }
                if let Ok(d) = self.dir_mut(*to_dir) {
                    d.durable.insert(to_name.clone(), *ino);
                }
            }
        }
    }

    fn crash(&mut self, mode: CrashMode) {
        // Files: durable bytes plus a chosen part of the volatile writes.
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        for ino in inos {
            let choice = match mode {
                CrashMode::KeepAll => 1,
                CrashMode::DropAll => 0,
                CrashMode::Seeded => self.rng.below(4),
            };
            // Draw every random number before borrowing the inode.
            let Some(Inode::File(f)) = self.inodes.get(&ino) else {
                continue;
            };
            let n = f.pending.len() as u64;
            let keep: Vec<OpFate> = match choice {
                0 => vec![OpFate::Drop; f.pending.len()],
                1 => vec![OpFate::Keep; f.pending.len()],
                2 => {
                    let cut = self.rng.below(n + 1);
                    let tear = self.rng.next_u64();
                    (0..n)
                        .map(|i| match i.cmp(&cut) {
                            std::cmp::Ordering::Less => OpFate::Keep,
                            std::cmp::Ordering::Equal => OpFate::Prefix(tear),
                            std::cmp::Ordering::Greater => OpFate::Drop,
                        })
                        .collect()
                }
                _ => (0..n)
                    .map(|_| {
                        if self.rng.coin() {
                            OpFate::Keep
                        } else {
                            OpFate::Drop
                        }
                    })
                    .collect(),
            };
            if let Some(Inode::File(f)) = self.inodes.get_mut(&ino) {
                let mut image = std::mem::take(&mut f.durable);
                for (op, fate) in f.pending.iter().zip(keep) {
                    match (fate, op) {
                        (OpFate::Keep, op) => apply_op(&mut image, op),
                        (OpFate::Prefix(r), DataOp::Write { pos, data }) => {
                            let len = usize_len(r % (data.len() as u64 + 1));
                            write_into(&mut image, *pos, &data[..len]);
                        }
                        (OpFate::Prefix(_), DataOp::SetLen(_)) | (OpFate::Drop, _) => {}
                    }
                }
                f.pending.clear();
                f.current = image.clone();
                f.durable = image;
            }
        }
        // Directories: each pending metadata operation, in order, by seed.
        let ops = std::mem::take(&mut self.pending_meta);
        for op in &ops {
            let keep = match mode {
                CrashMode::KeepAll => true,
                CrashMode::DropAll => false,
                CrashMode::Seeded => self.rng.coin(),
            };
            if keep {
                self.apply_meta_durable(op);
            }
        }
        for node in self.inodes.values_mut() {
            if let Inode::Dir(d) = node {
                d.current = d.durable.clone();
            }
        }
        self.collect_unreachable();
        self.power_cut_at = None;
        self.epoch += 1;
        self.crashes += 1;
    }

    /// Drops inodes no durable name reaches (a crash ends every process, so
    /// no open handle keeps them alive either).
    fn collect_unreachable(&mut self) {
        let mut reachable = std::collections::BTreeSet::new();
        let mut stack = vec![ROOT];
        while let Some(ino) = stack.pop() {
            if !reachable.insert(ino) {
                continue;
            }
            if let Some(Inode::Dir(d)) = self.inodes.get(&ino) {
                stack.extend(d.current.values().copied());
            }
        }
        self.inodes.retain(|ino, _| reachable.contains(ino));
    }
}

#[derive(Debug, Clone, Copy)]
enum OpFate {
    Keep,
    Drop,
    /// Keep a prefix of a write, its length drawn from this number.
    Prefix(u64),
}

impl SimFs {
    /// An empty filesystem (just the root directory) whose crash outcomes
    /// follow `seed`.
    pub fn new(seed: u64) -> Self {
        let mut inodes = BTreeMap::new();
        inodes.insert(ROOT, Inode::Dir(DirNode::default()));
        Self {
            state: Rc::new(RefCell::new(State {
                rng: Prng::new(seed),
                inodes,
                next_ino: ROOT + 1,
                pending_meta: Vec::new(),
                epoch: 0,
                calls: [0; FAULT_KINDS],
                faults: Vec::new(),
                now: Duration::ZERO,
                crashes: 0,
                total_calls: 0,
                power_cut_at: None,
                yielding: false,
                slow_syncs: false,
                space: None,
            })),
        }
    }

    /// Simulates a power loss decided by the seed: the filesystem becomes
    /// the image a reboot would see, and every open handle goes stale.
    pub fn crash(&self) {
        self.crash_with(CrashMode::Seeded);
    }

    /// Simulates a crash with an explicit policy for volatile state.
    pub fn crash_with(&self, mode: CrashMode) {
        self.state.borrow_mut().crash(mode);
    }

    /// Cuts the power after `calls` more calls: from then on every call
    /// that would touch the disk fails with EIO and changes nothing, until
    /// the next [`SimFs::crash`]. Crashing at call N for every N is how a
    /// test crashes "at every step" of a multi-call operation.
    pub fn cut_power_after(&self, calls: u64) {
        let mut s = self.state.borrow_mut();
        s.power_cut_at = Some(s.total_calls + calls);
    }

    /// Calls that reached the disk so far (every kind, failed ones too):
    /// how a test measures the filesystem work of one step.
    pub fn total_calls(&self) -> u64 {
        self.state.borrow().total_calls
    }

    /// Number of crashes simulated so far.
    pub fn crash_count(&self) -> u64 {
        self.state.borrow().crashes
    }

    fn arm(&self, kind: FaultKind, nth: u64, fault: Fault) {
        let mut s = self.state.borrow_mut();
        let at_call = s.calls[kind.index()] + nth.max(1);
        s.faults.push(ArmedFault {
            kind,
            at_call,
            fault,
        });
    }

    /// Makes [`Fs::yield_now`] return `Pending` once (waking itself) as a
    /// real runtime does, for tests of code that gathers the callers of
    /// one step; off by default, so that every call completes when made.
    pub fn set_yielding(&self, yielding: bool) {
        self.state.borrow_mut().yielding = yielding;
    }

    /// Makes every sync (file or directory) return `Pending` 1 to 4 times
    /// (drawn from the seed; waking itself each time) before it completes,
    /// so that concurrent callers interleave around their syncs as on a
    /// real disk; off by default.
    pub fn set_slow_syncs(&self, slow: bool) {
        self.state.borrow_mut().slow_syncs = slow;
    }

    /// Fills the disk: from now on files may grow by `room_bytes` more in
    /// all, and a write or `set_len` that would grow them past that lands
    /// what fits (a write its prefix, as a real short write does) and fails
    /// with `errno` (ENOSPC or EDQUOT). Shrinking a file gives its bytes
    /// back; writes within a file's length always land. Until
    /// [`Self::free_disk`].
    pub fn fill_disk(&self, room_bytes: u64, errno: i32) {
        self.state.borrow_mut().space = Some(SpaceLimit { room_bytes, errno });
    }

    /// Lifts [`Self::fill_disk`]: files grow without bound again.
    pub fn free_disk(&self) {
        self.state.borrow_mut().space = None;
    }

    /// Disarms every fault armed and not yet tripped (a test that armed a
    /// fault the code under test never reached clears it before rebooting).
    pub fn clear_faults(&self) {
        self.state.borrow_mut().faults.clear();
    }

    /// Makes the `nth` future call (1 = the next one) of `kind` fail with
    /// `errno` (use [`super::EIO`], [`super::ENOSPC`], [`super::EACCES`]).
    /// The failed call changes nothing.
    pub fn fail_nth(&self, kind: FaultKind, nth: u64, errno: i32) {
        self.arm(kind, nth, Fault::Errno(errno));
    }

    /// Makes the `nth` future write land only its first `keep` bytes
    /// (volatile, like any write) and then fail with EIO.
    pub fn tear_nth_write(&self, nth: u64, keep: usize) {
        self.arm(FaultKind::Write, nth, Fault::Torn { keep });
    }

    /// Makes the `nth` future read return at most `max` bytes (at least 1
    /// when any are available), as a short read may.
    pub fn short_nth_read(&self, nth: u64, max: usize) {
        self.arm(FaultKind::Read, nth, Fault::Short { max: max.max(1) });
    }

    /// Bit rot: XORs `mask` into the byte at `pos` of the file at `path`, in
    /// both its durable and its current content (the medium changed).
    pub fn rot_byte(&self, path: &Path, pos: u64, mask: u8) -> io::Result<()> {
        let mut s = self.state.borrow_mut();
        let ino = s.resolve(path)?;
        let f = s.file_mut(ino)?;
        let p = usize_len(pos);
        for content in [&mut f.durable, &mut f.current] {
            if let Some(b) = content.get_mut(p) {
                *b ^= mask;
            }
        }
        for op in &mut f.pending {
            if let DataOp::Write { pos: at, data } = op {
                let at = usize_len(*at);
                if p >= at && p < at + data.len() {
                    data[p - at] ^= mask;
                }
            }
        }
        Ok(())
    }

    /// The current (not necessarily durable) content of a file, for tests.
    pub fn contents(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut s = self.state.borrow_mut();
        let ino = s.resolve(path)?;
        Ok(s.file_mut(ino)?.current.clone())
    }

    /// The virtual time advanced by [`Fs::sleep`] calls.
    pub fn now(&self) -> Duration {
        self.state.borrow().now
    }

    fn check(&self, kind: FaultKind) -> io::Result<()> {
        match self.state.borrow_mut().tick(kind) {
            Some(Fault::Errno(e)) => Err(err(e)),
            _ => Ok(()),
        }
    }
}

impl Fs for SimFs {
    type File = SimFile;

    async fn open(&self, path: &Path, opts: OpenOptions) -> io::Result<SimFile> {
        self.check(FaultKind::Open)?;
        let mut s = self.state.borrow_mut();
        let (dir, name) = s.parent_of(path)?;
        let existing = s.dir(dir)?.current.get(&name).copied();
        let ino = match existing {
            Some(_) if opts.create_new => return Err(err(EEXIST)),
            Some(ino) => {
                let f = s.file_mut(ino)?;
                if opts.truncate && opts.write && !f.current.is_empty() {
                    f.current.clear();
                    f.pending.push(DataOp::SetLen(0));
                }
                ino
            }
            None if opts.create || opts.create_new => {
                let ino = s.alloc(Inode::File(FileNode::default()));
                s.link(dir, name, ino)?;
                ino
            }
            None => return Err(err(ENOENT)),
        };
        Ok(SimFile {
            state: Rc::clone(&self.state),
            ino,
            epoch: s.epoch,
            readable: opts.read,
            writable: opts.write,
        })
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.check(FaultKind::Rename)?;
        let mut s = self.state.borrow_mut();
        let (from_dir, from_name) = s.parent_of(from)?;
        let (to_dir, to_name) = s.parent_of(to)?;
        let ino = *s
            .dir(from_dir)?
            .current
            .get(&from_name)
            .ok_or_else(|| err(ENOENT))?;
        if let Some(target) = s.dir(to_dir)?.current.get(&to_name).copied() {
            if target == ino {
                return Ok(());
            }
            if matches!(s.inodes.get(&target), Some(Inode::Dir(_))) {
                return Err(err(EISDIR));
            }
        }
        s.dir_mut(from_dir)?.current.remove(&from_name);
        s.dir_mut(to_dir)?.current.insert(to_name.clone(), ino);
        s.pending_meta.push(MetaOp::Rename {
            from_dir,
            from_name,
            to_dir,
            to_name,
            ino,
        });
        Ok(())
    }

    async fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.check(FaultKind::Remove)?;
        let mut s = self.state.borrow_mut();
        let (dir, name) = s.parent_of(path)?;
        let ino = *s.dir(dir)?.current.get(&name).ok_or_else(|| err(ENOENT))?;
        if matches!(s.inodes.get(&ino), Some(Inode::Dir(_))) {
            return Err(err(EISDIR));
        }
        s.dir_mut(dir)?.current.remove(&name);
        s.pending_meta.push(MetaOp::Unlink { dir, name });
        Ok(())
    }

    async fn create_dir(&self, path: &Path) -> io::Result<()> {
        self.check(FaultKind::Open)?;
        let mut s = self.state.borrow_mut();
        let (dir, name) = s.parent_of(path)?;
        if s.dir(dir)?.current.contains_key(&name) {
            return Err(err(EEXIST));
        }
        let ino = s.alloc(Inode::Dir(DirNode::default()));
        s.link(dir, name, ino)
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let names: Vec<OsString> = State::names(path)?
            .into_iter()
            .map(OsStr::to_os_string)
            .collect();
        let mut at = std::path::PathBuf::from("/");
        for name in names {
            at.push(&name);
            let exists = {
                let s = self.state.borrow();
                s.resolve(&at).ok()
            };
            match exists {
                Some(ino) => {
                    self.state.borrow().dir(ino)?;
                }
                None => self.create_dir(&at).await?,
            }
        }
        Ok(())
    }

    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.check(FaultKind::Remove)?;
        let mut s = self.state.borrow_mut();
        let (dir, name) = s.parent_of(path)?;
        let ino = *s.dir(dir)?.current.get(&name).ok_or_else(|| err(ENOENT))?;
        if !s.dir(ino)?.current.is_empty() {
            return Err(err(ENOTEMPTY));
        }
        s.dir_mut(dir)?.current.remove(&name);
        s.pending_meta.push(MetaOp::Unlink { dir, name });
        Ok(())
    }

    async fn read_dir(&self, path: &Path) -> io::Result<Vec<DirEntry>> {
        self.check(FaultKind::ReadDir)?;
        let mut s = self.state.borrow_mut();
        let ino = s.resolve(path)?;
        let d = s.dir(ino)?;
        let mut out: Vec<DirEntry> = d
            .current
            .iter()
            .map(|(name, ino)| DirEntry {
                name: name.clone(),
                kind: match s.inodes.get(ino) {
                    Some(Inode::Dir(_)) => FileKind::Dir,
                    _ => FileKind::File,
                },
            })
            .collect();
        // A real directory lists in no particular order; shuffle (by seed)
        // so callers that forget to sort fail here, not in production.
        for i in (1..out.len()).rev() {
            let j = s.rng.below(i as u64 + 1) as usize;
            out.swap(i, j);
        }
        Ok(out)
    }

    async fn metadata(&self, path: &Path) -> io::Result<Metadata> {
        let s = self.state.borrow();
        let ino = s.resolve(path)?;
        Ok(match s.inodes.get(&ino) {
            Some(Inode::File(f)) => Metadata {
                len: f.current.len() as u64,
                kind: FileKind::File,
            },
            Some(Inode::Dir(d)) => Metadata {
                len: d.current.len() as u64,
                kind: FileKind::Dir,
            },
            None => return Err(err(ENOENT)),
        })
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        // Drawn first: no borrow of the state may live across the await.
        let times = self.state.borrow_mut().sync_suspends();
        suspend(times).await;
        self.check(FaultKind::Sync)?;
        let mut s = self.state.borrow_mut();
        let dir = s.resolve(path)?;
        s.dir(dir)?;
        // Every pending operation that touches this directory becomes
        // durable (ext4 commits a cross-directory rename as one unit).
        let ops = std::mem::take(&mut s.pending_meta);
        let mut rest = Vec::with_capacity(ops.len());
        for op in ops {
            if op.touches(dir) {
                s.apply_meta_durable(&op);
            } else {
                rest.push(op);
            }
        }
        s.pending_meta = rest;
        Ok(())
    }

    async fn sleep(&self, duration: Duration) {
        let mut s = self.state.borrow_mut();
        s.now = s.now.saturating_add(duration);
    }

    async fn yield_now(&self) {
        if self.state.borrow().yielding {
            super::YieldNow::default().await;
        }
    }
}

impl SimFile {
    async fn suspend_if_slow(&self) {
        // Drawn first: no borrow of the state may live across the await.
        let times = self.state.borrow_mut().sync_suspends();
        suspend(times).await;
    }

    fn live(&self) -> io::Result<()> {
        if self.state.borrow().epoch == self.epoch {
            Ok(())
        } else {
            // The process that opened this handle did not survive the crash.
            Err(err(EIO))
        }
    }

    fn sync(&self) -> io::Result<()> {
        self.live()?;
        let mut s = self.state.borrow_mut();
        if let Some(Fault::Errno(e)) = s.tick(FaultKind::Sync) {
            return Err(err(e));
        }
        let f = s.file_mut(self.ino)?;
        let pending = std::mem::take(&mut f.pending);
        for op in &pending {
            apply_op(&mut f.durable, op);
        }
        debug_assert_eq!(f.durable, f.current, "sync must leave durable == current");
        Ok(())
    }
}

impl FsFile for SimFile {
    async fn read_at(&self, mut buf: Vec<u8>, pos: u64, max: usize) -> BufResult<usize, Vec<u8>> {
        if let Err(e) = self.live() {
            return BufResult(Err(e), buf);
        }
        if !self.readable {
            return BufResult(Err(err(EBADF)), buf);
        }
        let mut s = self.state.borrow_mut();
        let mut max = max.min(buf.capacity() - buf.len());
        match s.tick(FaultKind::Read) {
            Some(Fault::Errno(e)) => return BufResult(Err(err(e)), buf),
            Some(Fault::Short { max: short }) => max = max.min(short),
            _ => {}
        }
        let f = match s.file_mut(self.ino) {
            Ok(f) => f,
            Err(e) => return BufResult(Err(e), buf),
        };
        let start = usize_len(pos).min(f.current.len());
        let end = start.saturating_add(max).min(f.current.len());
        buf.extend_from_slice(&f.current[start..end]);
        BufResult(Ok(end - start), buf)
    }

    async fn write_at<B: IoBuf>(&self, buf: B, pos: u64) -> BufResult<usize, B> {
        if let Err(e) = self.live() {
            return BufResult(Err(e), buf);
        }
        if !self.writable {
            return BufResult(Err(err(EBADF)), buf);
        }
        let data_len = buf.buf_len() as u64;
        if pos.saturating_add(data_len) > SIM_FILE_BYTES_MAX {
            return BufResult(Err(err(EFBIG)), buf);
        }
        let mut s = self.state.borrow_mut();
        let fault = s.tick(FaultKind::Write);
        let data = buf.as_init();
        let (mut land, mut result) = match fault {
            Some(Fault::Errno(e)) => return BufResult(Err(err(e)), buf),
            Some(Fault::Torn { keep }) => (&data[..keep.min(data.len())], Err(err(EIO))),
            _ => (data, Ok(data.len())),
        };
        let mut space = s.space;
        let f = match s.file_mut(self.ino) {
            Ok(f) => f,
            Err(e) => return BufResult(Err(e), buf),
        };
        if let Some(limit) = space.as_mut() {
            let len = f.current.len() as u64;
            // A write never shrinks a file.
            let end = pos.saturating_add(land.len() as u64).max(len);
            let fits = limit.take(len, end);
            if end > len && fits < end - len {
                // Lands up to where the room ends, then the disk is full.
                let keep = usize_len((len + fits).saturating_sub(pos)).min(land.len());
                land = &land[..keep];
                result = Err(err(limit.errno));
            }
        }
        if !land.is_empty() {
            write_into(&mut f.current, pos, land);
            f.pending.push(DataOp::Write {
                pos,
                data: land.to_vec(),
            });
        }
        s.space = space;
        BufResult(result, buf)
    }

    async fn sync_data(&self) -> io::Result<()> {
        self.suspend_if_slow().await;
        self.sync()
    }

    async fn sync_all(&self) -> io::Result<()> {
        self.suspend_if_slow().await;
        self.sync()
    }

    async fn set_len(&self, len: u64) -> io::Result<()> {
        self.live()?;
        if !self.writable {
            return Err(err(EINVAL));
        }
        if len > SIM_FILE_BYTES_MAX {
            return Err(err(EFBIG));
        }
        let mut s = self.state.borrow_mut();
        if let Some(Fault::Errno(e)) = s.tick(FaultKind::Write) {
            return Err(err(e));
        }
        let mut space = s.space;
        let f = s.file_mut(self.ino)?;
        if let Some(limit) = space.as_mut() {
            let current = f.current.len() as u64;
            let fits = limit.take(current, len);
            if len > current && fits < len - current {
                // A real filesystem refuses the whole extension.
                limit.room_bytes += fits;
                let errno = limit.errno;
                s.space = space;
                return Err(err(errno));
            }
        }
        f.current.resize(usize_len(len), 0);
        f.pending.push(DataOp::SetLen(len));
        s.space = space;
        Ok(())
    }

    async fn len(&self) -> io::Result<u64> {
        self.live()?;
        let mut s = self.state.borrow_mut();
        Ok(s.file_mut(self.ino)?.current.len() as u64)
    }

    async fn preallocate(&self, _len: u64) -> io::Result<()> {
        // KEEP_SIZE preallocation changes nothing a reader can observe.
        self.live()
    }
}
