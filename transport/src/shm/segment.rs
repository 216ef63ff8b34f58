//! POSIX shared-memory segments (`shm_open` + `mmap(MAP_SHARED)`) that connect the processes of
//! one host.
//!
//! One process [creates](Segment::create) a segment under a fresh, unguessable name
//! (`/ampccl.<pid>.<32 hex chars>`), sends the name to its peers out of band, and the peers
//! [open](Segment::open) it. Once every peer has mapped it, the owner calls
//! [`unlink`](Segment::unlink) so that the name disappears while the mappings stay valid; the memory
//! is freed by the kernel when the last mapping goes away. Should the owner forget, dropping it
//! unlinks the name, so a clean exit never leaks a segment. A crash between `create` and `unlink`
//! does leave a file in `/dev/shm`; [`sweep_stale`] removes those whose creator is gone.

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use rand::TryRngCore;
use rand::rngs::OsRng;
use rustix::fs::Mode;
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};
use rustix::shm;

use crate::{Error, Result};

/// Prefix of every segment name ampccl creates (the leading `/` is part of the POSIX name; the
/// file in `/dev/shm` lacks it).
pub const NAME_PREFIX: &str = "/ampccl.";

/// Infix of rendezvous segment names: `/ampccl.rdv.<key>` (see [`Segment::open_or_create`]).
const RENDEZVOUS_TAG: &str = "rdv.";

/// Age after which [`sweep_stale`] treats a rendezvous segment as left by a crash: parties unlink
/// it as soon as all of them have mapped it, which takes seconds.
pub const RENDEZVOUS_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Directory where Linux keeps POSIX shared-memory objects.
const SHM_DIR: &str = "/dev/shm";

/// Number of random hex characters in a segment name (128 bits from the OS RNG).
const RANDOM_HEX_LEN: usize = 32;

/// How many times `create` draws a new name if the random one already exists.
const CREATE_ATTEMPTS: usize = 8;

/// A POSIX shared-memory segment mapped read/write and shared into this process.
///
/// The mapping starts at a page-aligned address and is `len()` bytes long. A segment made by
/// [`Segment::create`] is the *owner*: it unlinks the name on drop unless [`Segment::unlink`] was
/// called before. A segment made by [`Segment::open`] only unmaps on drop.
///
/// The segment never reads or writes its contents itself (except [`Segment::prefault`]); all
/// access goes through the raw pointer from [`Segment::as_ptr`], and synchronizing that access
/// (within this process and with other processes) is the caller's job.
pub struct Segment {
    name: String,
    ptr: NonNull<u8>,
    len: usize,
    owner: bool,
    unlinked: AtomicBool,
}

// SAFETY: a `Segment` is a name plus a shared mapping that stays valid until drop, whichever
// thread drops it; `munmap` and `shm_unlink` may be called from any thread. The struct hands out
// only a raw pointer to the contents and never reads or writes them without atomics itself
// (`prefault` uses atomic RMW or `madvise`), so moving it to another thread cannot introduce a data
// race: other processes can write the memory at any time anyway, and synchronizing the contents is
// the job of the code that dereferences the pointer.
unsafe impl Send for Segment {}
// SAFETY: every `&self` method is either read-only on immutable fields, an idempotent syscall
// guarded by the `unlinked` atomic, or (`prefault`) a contents-preserving atomic touch; see the
// `Send` impl for why the contents themselves are not this type's concern.
unsafe impl Sync for Segment {}

impl fmt::Debug for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment")
            .field("name", &self.name)
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("owner", &self.owner)
            .field("unlinked", &self.unlinked.load(Ordering::Relaxed))
            .finish()
    }
}

impl Segment {
    /// Creates a new zero-filled segment of `len` bytes under a fresh name
    /// `/ampccl.<pid>.<32 random hex chars>` with mode `0600` and maps it; the result is the
    /// owner. `len` must be non-zero.
    pub fn create(len: usize) -> Result<Segment> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "shared-memory segment length must be non-zero".into(),
            ));
        }
        let pid = rustix::process::getpid().as_raw_nonzero().get();
        let mut attempt = 0;
        let (name, fd) = loop {
            attempt += 1;
            let name = format!("{NAME_PREFIX}{pid}.{}", random_hex()?);
            match shm::open(
                name.as_str(),
                shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => break (name, fd),
                Err(Errno::EXIST) if attempt < CREATE_ATTEMPTS => continue,
                Err(e) => return Err(Error::system(format!("shm_open({name}, O_CREAT)"), e)),
            }
        };
        // From here on, remove the name again if anything fails.
        let mapped = (|| {
            let size = u64::try_from(len)
                .map_err(|_| Error::InvalidArgument(format!("segment length {len} too large")))?;
            rustix::fs::ftruncate(&fd, size)
                .map_err(|e| Error::system(format!("ftruncate({name}, {len})"), e))?;
            map(&name, &fd, len)
        })();
        match mapped {
            Ok(ptr) => {
                tracing::debug!(name, len, "created shared-memory segment");
                Ok(Segment {
                    name,
                    ptr,
                    len,
                    owner: true,
                    unlinked: AtomicBool::new(false),
                })
            }
            Err(e) => {
                let _ = shm::unlink(name.as_str());
                Err(e)
            }
        }
    }

    /// Opens and maps the first `len` bytes of the existing segment `name` (as returned by
    /// [`Segment::name`] of the creator).
    ///
    /// Errors: [`Error::InvalidArgument`] for a name that is not an ampccl segment name or a zero
    /// `len`, [`Error::InvalidUsage`] if the segment is smaller than `len`, [`Error::System`] if it
    /// cannot be opened (e.g. it does not exist or was unlinked) or mapped.
    pub fn open(name: &str, len: usize) -> Result<Segment> {
        validate_name(name)?;
        if len == 0 {
            return Err(Error::InvalidArgument(
                "shared-memory segment length must be non-zero".into(),
            ));
        }
        let fd = shm::open(name, shm::OFlags::RDWR, Mode::empty())
            .map_err(|e| Error::system(format!("shm_open({name})"), e))?;
        let stat =
            rustix::fs::fstat(&fd).map_err(|e| Error::system(format!("fstat({name})"), e))?;
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        if size < len as u64 {
            return Err(Error::InvalidUsage(format!(
                "shared-memory segment {name} has {size} bytes, {len} requested"
            )));
        }
        let ptr = map(name, &fd, len)?;
        tracing::debug!(name, len, "opened shared-memory segment");
        Ok(Segment {
            name: name.to_owned(),
            ptr,
            len,
            owner: false,
            unlinked: AtomicBool::new(false),
        })
    }

    /// Opens the rendezvous segment `/ampccl.rdv.<key>`, creating it (zero-filled, mode `0600`)
    /// if no process has yet, and maps `len` bytes of it. Processes that derive the same `key`
    /// from something they share (e.g. a communicator's unique id) meet in the same memory
    /// without exchanging a name first. The result is never the owner: whoever knows that every
    /// party has mapped it calls [`Segment::unlink`]. All parties must ask for the same `len`;
    /// a segment of another size is refused. `key` must be 1–64 characters `[0-9a-zA-Z_-]`.
    ///
    /// A process that crashes before the name is unlinked leaves the file behind; [`sweep_stale`]
    /// removes rendezvous segments older than [`RENDEZVOUS_MAX_AGE`].
    pub fn open_or_create(key: &str, len: usize) -> Result<Segment> {
        if key.is_empty()
            || key.len() > 64
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(Error::InvalidArgument(format!(
                "bad rendezvous key {key:?}"
            )));
        }
        if len == 0 {
            return Err(Error::InvalidArgument(
                "shared-memory segment length must be non-zero".into(),
            ));
        }
        let name = format!("{NAME_PREFIX}{RENDEZVOUS_TAG}{key}");
        let fd = shm::open(
            name.as_str(),
            shm::OFlags::CREATE | shm::OFlags::RDWR,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| Error::system(format!("shm_open({name}, O_CREAT)"), e))?;
        let size = u64::try_from(len)
            .map_err(|_| Error::InvalidArgument(format!("segment length {len} too large")))?;
        let stat =
            rustix::fs::fstat(&fd).map_err(|e| Error::system(format!("fstat({name})"), e))?;
        match u64::try_from(stat.st_size).unwrap_or(0) {
            // Fresh (or being sized by another party right now: same length, same result).
            0 => rustix::fs::ftruncate(&fd, size)
                .map_err(|e| Error::system(format!("ftruncate({name}, {len})"), e))?,
            s if s == size => {}
            s => {
                return Err(Error::InvalidUsage(format!(
                    "rendezvous segment {name} has {s} bytes, this process expects {len} \
                     (different settings on different ranks?)"
                )));
            }
        }
        let ptr = map(&name, &fd, len)?;
        tracing::debug!(name, len, "opened rendezvous segment");
        Ok(Segment {
            name,
            ptr,
            len,
            owner: false,
            unlinked: AtomicBool::new(false),
        })
    }

    /// Removes the name from the system so that no further process can open the segment;
    /// existing mappings (this one included) stay valid. Idempotent: calling it again, or after
    /// some other process removed the name, is fine.
    pub fn unlink(&self) -> Result<()> {
        if self.unlinked.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        match shm::unlink(self.name.as_str()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => {
                self.unlinked.store(false, Ordering::Release);
                Err(Error::system(format!("shm_unlink({})", self.name), e))
            }
        }
    }

    /// The POSIX name of the segment (`/ampccl.<pid>.<hex>`), to be passed to [`Segment::open`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Page-aligned start of the mapping, valid for reads and writes of `len()` bytes until the
    /// segment is dropped. Other processes may access the memory concurrently.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: segments are at least one byte long.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this handle created the segment (and therefore unlinks it on drop if needed).
    pub fn is_owner(&self) -> bool {
        self.owner
    }

    /// Faults in every page of the mapping for writing, so that later accesses do not page-fault.
    ///
    /// The contents are left unchanged: it uses `madvise(MADV_POPULATE_WRITE)` where the kernel
    /// has it (Linux 5.14+) and otherwise touches one byte per page with an atomic
    /// `fetch_or(0)`, a write access that stores the value it read. Best called before the
    /// segment is shared, as the fallback is an atomic access to memory others might be writing.
    pub fn prefault(&self) {
        // SAFETY: `ptr..ptr+len` is our mapping; MADV_POPULATE_WRITE only populates page tables
        // and never changes contents.
        let rc = unsafe {
            libc::madvise(
                self.ptr.as_ptr().cast::<c_void>(),
                self.len,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return;
        }
        let page = page_size();
        let mut off = 0;
        while off < self.len {
            // SAFETY: `off < len`, so the byte is inside our live, writable mapping; `AtomicU8`
            // has the alignment and size of `u8`, and the access is atomic.
            let byte = unsafe { AtomicU8::from_ptr(self.ptr.as_ptr().add(off)) };
            byte.fetch_or(0, Ordering::Relaxed);
            off += page;
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // (No let-chain: the workspace's rust-version is 1.85.)
        let result = if self.owner && !self.unlinked.load(Ordering::Acquire) {
            self.unlink()
        } else {
            Ok(())
        };
        if let Err(e) = result {
            tracing::warn!(name = self.name, error = %e, "cannot unlink shared-memory segment");
        }
        // SAFETY: `ptr`/`len` describe the mapping made in `map`, which nothing else unmaps;
        // after drop no pointer from `as_ptr` may be used (documented there).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast::<c_void>(), self.len) }
        {
            tracing::warn!(name = self.name, error = %e, "cannot unmap shared-memory segment");
        }
    }
}

/// Maps `len` bytes of `fd` read/write shared, every page faulted in at once
/// (`MAP_POPULATE`): a window's first pass otherwise takes a page fault per page in every
/// process that maps it, which made the first few dozen small broadcasts of a job several
/// times slower than the rest.
pub(super) fn map(name: &str, fd: &rustix::fd::OwnedFd, len: usize) -> Result<NonNull<u8>> {
    // SAFETY: a fresh mapping at a kernel-chosen address (null hint) cannot overlap any existing
    // Rust object; the fd stays open for the duration of the call.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED | MapFlags::POPULATE,
            fd,
            0,
        )
    }
    .map_err(|e| Error::system(format!("mmap({name}, {len})"), e))?;
    NonNull::new(ptr.cast::<u8>())
        .ok_or_else(|| Error::Internal(format!("mmap({name}) returned a null pointer")))
}

/// 32 lowercase hex characters from the OS RNG.
fn random_hex() -> Result<String> {
    let mut bytes = [0u8; RANDOM_HEX_LEN / 2];
    OsRng
        .try_fill_bytes(&mut bytes)
        .map_err(|e| Error::system("OS random number generator", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Accepts `/ampccl.<anything without '/' or NUL>` of at most 255 bytes.
fn validate_name(name: &str) -> Result<()> {
    let ok = name.len() > NAME_PREFIX.len()
        && name.len() <= 255
        && name.starts_with(NAME_PREFIX)
        && !name[1..].contains('/')
        && !name.contains('\0');
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{name:?} is not an ampccl shared-memory segment name ({NAME_PREFIX}...)"
        )))
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(v).ok().filter(|&p| p > 0).unwrap_or(4096)
}

/// Parses the pid out of a `/dev/shm` file name `ampccl.<pid>.<32 hex>` (no leading slash);
/// `None` if the name is not exactly of the form `create` produces.
fn stale_candidate_pid(file_name: &str) -> Option<i32> {
    let rest = file_name.strip_prefix(&NAME_PREFIX[1..])?;
    let (pid, hex) = rest.split_once('.')?;
    if hex.len() != RANDOM_HEX_LEN || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse::<i32>().ok().filter(|&p| p > 0)
}

/// Whether `file_name` in `/dev/shm` is a rendezvous segment last modified more than
/// [`RENDEZVOUS_MAX_AGE`] ago.
fn is_stale_rendezvous(entry: &std::fs::DirEntry, file_name: &str) -> bool {
    let Some(key) = file_name
        .strip_prefix(&NAME_PREFIX[1..])
        .and_then(|r| r.strip_prefix(RENDEZVOUS_TAG))
    else {
        return false;
    };
    !key.is_empty()
        && entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > RENDEZVOUS_MAX_AGE)
}

/// Unlinks the segments left in `/dev/shm` by ampccl processes that no longer exist and returns
/// how many were removed.
///
/// A segment `ampccl.<pid>.<hex>` is stale when `kill(pid, 0)` fails with `ESRCH`; if it
/// succeeds or fails with `EPERM` (the process exists but belongs to someone else) the segment is
/// kept. Only names of exactly the form [`Segment::create`] produces are considered.
///
/// Known, accepted risks: (1) pid reuse — if the creator died and its pid now belongs to an
/// unrelated live process, the stale segment is merely kept (a leak, never a wrong removal);
/// (2) the opposite, removing a live segment, can only happen if `/dev/shm` is shared by processes
/// in different pid namespaces (e.g. containers run with `--ipc=host` but a private pid
/// namespace), where a live creator's pid can look dead from here. Processes that already mapped
/// a removed segment keep their mapping; only later `open`s would fail.
pub fn sweep_stale() -> usize {
    sweep_stale_in(SHM_DIR)
}

fn sweep_stale_in(dir: &str) -> usize {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::debug!(dir, error = %e, "cannot scan for stale shared-memory segments");
            return 0;
        }
    };
    let me = rustix::process::getpid().as_raw_nonzero().get();
    let mut removed = 0;
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if is_stale_rendezvous(&entry, file_name) {
            let name = format!("/{file_name}");
            if shm::unlink(name.as_str()).is_ok() {
                tracing::info!(name, "removed stale rendezvous segment");
                removed += 1;
            }
            continue;
        }
        let Some(pid) = stale_candidate_pid(file_name) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Some(p) = rustix::process::Pid::from_raw(pid) else {
            continue;
        };
        match rustix::process::test_kill_process(p) {
            Err(Errno::SRCH) => {}
            // Alive (Ok), or alive but not ours (EPERM), or unknown: keep it.
            _ => continue,
        }
        let name = format!("/{file_name}");
        match shm::unlink(name.as_str()) {
            Ok(()) => {
                tracing::info!(
                    name,
                    pid,
                    "removed stale shared-memory segment of dead process"
                );
                removed += 1;
            }
            Err(Errno::NOENT) => {} // someone else swept it first
            Err(e) => {
                tracing::info!(name, pid, error = %e, "cannot remove stale shared-memory segment");
            }
        }
    }
    removed
}

#[cfg(test)]
pub(crate) mod test_support {
    //! Re-executing the test binary as a child process: `fork()` in the multithreaded test
    //! harness is unsafe, so a multi-process test runs one named test of this binary in a child.

    use std::process::{Child, Command, Stdio};

    /// Environment variable that tells a re-executed test which role it plays.
    pub const ROLE_VAR: &str = "AMPCCL_TEST_CHILD_ROLE";

    /// The role this process plays, if it was started by [`spawn_child`].
    pub fn child_role() -> Option<String> {
        std::env::var(ROLE_VAR).ok()
    }

    /// Full libtest name (without the crate) of test `name` in module `module` (`module_path!()`).
    pub fn test_name(module: &str, name: &str) -> String {
        let module = module.split_once("::").map_or("", |(_, rest)| rest);
        if module.is_empty() {
            name.to_owned()
        } else {
            format!("{module}::{name}")
        }
    }

    /// Runs test `test` of this binary in a child process with role `role` and extra environment.
    pub fn spawn_child(test: &str, role: &str, env: &[(&str, String)]) -> Child {
        let exe = std::env::current_exe().expect("current_exe");
        let mut cmd = Command::new(exe);
        cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(ROLE_VAR, role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.spawn().expect("spawn child test process")
    }

    /// Kills (by its handle) and reaps a child on drop, so a failing parent leaves no orphan.
    pub struct ChildGuard(pub Option<Child>);

    impl ChildGuard {
        pub fn child(&mut self) -> &mut Child {
            self.0.as_mut().expect("child")
        }
        pub fn wait(mut self) -> std::process::ExitStatus {
            let mut c = self.0.take().expect("child");
            drop(c.stdin.take());
            c.wait().expect("wait child")
        }
    }

    impl Drop for ChildGuard {
        fn drop(&mut self) {
            if let Some(mut c) = self.0.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Marker that starts every line a child role reports to its parent.
    pub const MARKER: &str = "AMPCCL_CHILD ";

    /// The report in a line of child output, i.e. the text after [`MARKER`]. libtest prints
    /// `test NAME ... ` without a newline before running a test, so the marker need not start
    /// the line.
    pub fn report(line: &str) -> Option<&str> {
        line.find(MARKER).map(|i| &line[i + MARKER.len()..])
    }

    /// The pid of a process that has certainly exited (and been reaped).
    pub fn dead_pid() -> u32 {
        let mut c = Command::new("true").spawn().expect("spawn true");
        let pid = c.id();
        c.wait().expect("wait true");
        pid
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;

    fn shm_path(name: &str) -> PathBuf {
        PathBuf::from(SHM_DIR).join(&name[1..])
    }

    #[test]
    fn create_open_share_memory() {
        if child_role().is_some() {
            return;
        }
        let a = Segment::create(3 * 4096 + 5).unwrap();
        assert!(a.is_owner());
        assert_eq!(a.as_ptr() as usize % page_size(), 0, "page-aligned");
        assert!(
            a.name()
                .starts_with(&format!("{NAME_PREFIX}{}.", std::process::id()))
        );
        assert_eq!(
            a.name().len(),
            NAME_PREFIX.len() + std::process::id().to_string().len() + 33
        );
        // SAFETY: both mappings are live and `len` long; this test is the only user.
        unsafe {
            let s = std::slice::from_raw_parts(a.as_ptr(), a.len());
            assert!(s.iter().all(|&b| b == 0), "zero-filled");
        }
        let b = Segment::open(a.name(), a.len()).unwrap();
        assert!(!b.is_owner());
        assert_ne!(a.as_ptr(), b.as_ptr(), "two distinct mappings");
        // SAFETY: as above; writes through one mapping, reads through the other.
        unsafe {
            for i in 0..a.len() {
                a.as_ptr().add(i).write_volatile((i % 251) as u8);
            }
            for i in 0..b.len() {
                assert_eq!(b.as_ptr().add(i).read_volatile(), (i % 251) as u8);
            }
            b.as_ptr().add(4096).write_volatile(0xAB);
            assert_eq!(a.as_ptr().add(4096).read_volatile(), 0xAB);
        }
        // A shorter view is fine.
        let c = Segment::open(a.name(), 10).unwrap();
        assert_eq!(c.len(), 10);
        a.prefault();
        // SAFETY: as above.
        unsafe {
            assert_eq!(
                b.as_ptr().add(4096).read_volatile(),
                0xAB,
                "prefault keeps data"
            )
        };
        a.unlink().unwrap();
        a.unlink().unwrap(); // idempotent
        // Existing mappings survive unlink.
        // SAFETY: as above.
        unsafe { assert_eq!(c.as_ptr().add(7).read_volatile(), 7) };
    }

    #[test]
    fn rendezvous_segments_meet_by_key_and_refuse_other_sizes() {
        let key = format!(
            "test-{}-{}",
            std::process::id(),
            &random_hex().unwrap()[..8]
        );
        let a = Segment::open_or_create(&key, 8192).unwrap();
        let b = Segment::open_or_create(&key, 8192).unwrap();
        assert!(!a.is_owner() && !b.is_owner());
        // SAFETY: both mappings are live and 8192 bytes long; this test is the only user.
        unsafe {
            a.as_ptr().add(100).write_volatile(42);
            assert_eq!(b.as_ptr().add(100).read_volatile(), 42, "same memory");
        }
        assert!(matches!(
            Segment::open_or_create(&key, 4096),
            Err(Error::InvalidUsage(_))
        ));
        assert!(Segment::open_or_create("bad/key", 4096).is_err());
        assert!(Segment::open_or_create("", 4096).is_err());
        a.unlink().unwrap();
        assert!(!shm_path(b.name()).exists(), "unlinked");
        b.unlink().unwrap(); // someone else unlinked first: fine
    }

    #[test]
    fn open_nonexistent_fails() {
        let name = format!(
            "{NAME_PREFIX}{}.{}",
            std::process::id(),
            random_hex().unwrap()
        );
        match Segment::open(&name, 16) {
            Err(Error::System(msg)) => assert!(msg.contains(&name), "{msg}"),
            other => panic!("expected System error, got {other:?}"),
        }
    }

    #[test]
    fn open_too_long_is_invalid_usage() {
        let a = Segment::create(4096).unwrap();
        assert!(matches!(
            Segment::open(a.name(), 4097),
            Err(Error::InvalidUsage(_))
        ));
        assert!(Segment::open(a.name(), 4096).is_ok());
    }

    #[test]
    fn bad_names_and_lengths_are_invalid_argument() {
        for bad in [
            "",
            "/",
            "/ampccl.",
            "ampccl.1.abc",
            "/foo",
            "/ampcclx.1.ab",
            "/ampccl./x",
            "/ampccl.1\0",
        ] {
            assert!(
                matches!(Segment::open(bad, 8), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(Segment::create(0), Err(Error::InvalidArgument(_))));
        let a = Segment::create(64).unwrap();
        assert!(matches!(
            Segment::open(a.name(), 0),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn file_mode_is_0600() {
        let a = Segment::create(100).unwrap();
        let meta = std::fs::metadata(shm_path(a.name())).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert_eq!(meta.len(), 100);
    }

    #[test]
    fn unlink_then_open_fails() {
        let a = Segment::create(64).unwrap();
        a.unlink().unwrap();
        assert!(!shm_path(a.name()).exists());
        assert!(matches!(Segment::open(a.name(), 64), Err(Error::System(_))));
        // Non-owner unlink of an already removed name is fine too.
        a.unlink().unwrap();
    }

    #[test]
    fn drop_of_owner_unlinks() {
        let a = Segment::create(64).unwrap();
        let name = a.name().to_owned();
        let b = Segment::open(&name, 64).unwrap();
        drop(b); // a non-owner drop leaves the name
        assert!(shm_path(&name).exists());
        drop(a);
        assert!(!shm_path(&name).exists());
        assert!(Segment::open(&name, 64).is_err());
    }

    #[test]
    fn segment_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Segment>();
        let a = std::sync::Arc::new(Segment::create(4096).unwrap());
        let b = a.clone();
        std::thread::spawn(move || {
            // SAFETY: the mapping is live; the main thread waits (join) before reading.
            unsafe { b.as_ptr().write_volatile(42) }
        })
        .join()
        .unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { a.as_ptr().read_volatile() }, 42);
    }

    const SEG_NAME_VAR: &str = "AMPCCL_TEST_SEG_NAME";
    const SEG_LEN: usize = 2 * 4096 + 17;

    /// Child role: opens the parent's segment by name, checks the parent's marker, writes a
    /// pattern, and reports its pid.
    #[test]
    fn child_segment_writer() {
        if child_role().as_deref() != Some("segment-writer") {
            return;
        }
        let name = std::env::var(SEG_NAME_VAR).unwrap();
        let seg = Segment::open(&name, SEG_LEN).unwrap();
        // SAFETY: the parent does not touch the segment until this process exits.
        unsafe {
            assert_eq!(seg.as_ptr().read_volatile(), 0x5A, "parent's marker");
            for i in 1..SEG_LEN {
                seg.as_ptr().add(i).write_volatile((i * 7 % 256) as u8);
            }
        }
        println!("AMPCCL_CHILD pid {}", std::process::id());
    }

    #[test]
    fn multi_process_segment() {
        if child_role().is_some() {
            return;
        }
        let seg = Segment::create(SEG_LEN).unwrap();
        // SAFETY: no other user until the child starts.
        unsafe { seg.as_ptr().write_volatile(0x5A) };
        let mut child = ChildGuard(Some(spawn_child(
            &test_name(module_path!(), "child_segment_writer"),
            "segment-writer",
            &[(SEG_NAME_VAR, seg.name().to_owned())],
        )));
        let stdout = child.child().stdout.take().unwrap();
        let lines: Vec<String> = BufReader::new(stdout).lines().map(|l| l.unwrap()).collect();
        let status = child.wait();
        assert!(status.success(), "child failed: {status:?}\n{lines:#?}");
        assert!(
            lines
                .iter()
                .any(|l| report(l).is_some_and(|r| r.starts_with("pid "))),
            "child did not run its role: {lines:#?}"
        );
        // SAFETY: the child has exited; we are the only user.
        unsafe {
            assert_eq!(seg.as_ptr().read_volatile(), 0x5A);
            for i in 1..SEG_LEN {
                assert_eq!(
                    seg.as_ptr().add(i).read_volatile(),
                    (i * 7 % 256) as u8,
                    "byte {i}"
                );
            }
        }
    }

    #[test]
    fn stale_name_parsing() {
        let hex = "0123456789abcdef0123456789ABCDEF";
        assert_eq!(stale_candidate_pid(&format!("ampccl.123.{hex}")), Some(123));
        assert_eq!(stale_candidate_pid(&format!("ampccl.0.{hex}")), None);
        assert_eq!(stale_candidate_pid(&format!("ampccl.-1.{hex}")), None);
        assert_eq!(stale_candidate_pid(&format!("ampccl..{hex}")), None);
        assert_eq!(stale_candidate_pid(&format!("ampccl.12.{hex}x")), None);
        assert_eq!(stale_candidate_pid("ampccl.12.abc"), None);
        assert_eq!(stale_candidate_pid(&format!("other.12.{hex}")), None);
        assert_eq!(
            stale_candidate_pid(&format!("ampccl.99999999999.{hex}")),
            None
        );
    }

    #[test]
    fn sweep_removes_dead_keeps_live() {
        if child_role().is_some() {
            return;
        }
        let dead = dead_pid();
        let dead_name = format!("{NAME_PREFIX}{dead}.{}", random_hex().unwrap());
        let fd = shm::open(
            dead_name.as_str(),
            shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        drop(fd);
        // A live segment of another process: our parent (the test runner's parent is alive).
        let parent = rustix::process::getppid().map(|p| p.as_raw_nonzero().get());
        let live_other = parent.map(|p| {
            let name = format!("{NAME_PREFIX}{p}.{}", random_hex().unwrap());
            let fd = shm::open(
                name.as_str(),
                shm::OFlags::CREATE | shm::OFlags::EXCL | shm::OFlags::RDWR,
                Mode::from_raw_mode(0o600),
            )
            .unwrap();
            drop(fd);
            name
        });
        let mine = Segment::create(64).unwrap();
        assert!(shm_path(&dead_name).exists());

        let removed = sweep_stale();
        assert!(removed >= 1, "removed {removed}");
        assert!(
            !shm_path(&dead_name).exists(),
            "dead pid's segment survived"
        );
        assert!(
            shm_path(mine.name()).exists(),
            "own live segment was removed"
        );
        if let Some(name) = live_other {
            let survived = shm_path(&name).exists();
            let _ = shm::unlink(name.as_str());
            assert!(survived, "live parent's segment was removed");
        }
        assert!(Segment::open(mine.name(), 64).is_ok());
    }
}
