//! Shared user memory: buffers that the other processes of the host can map, so that a peer
//! reaches them with plain loads and stores instead of going through a window (the analogue of
//! `ncclMemAlloc` + registration, for shared memory).
//!
//! [`SharedMem::new`] creates an anonymous memory file (`memfd_create`, named `ampccl.<id>`
//! with an id unique in this process), maps it and enters it in a process-wide table.
//! [`find`] tells the device whether a user buffer lies in such an allocation; the device then
//! names it in a clear-to-send as `(key, addr)` = ([`key_of`], [`addr_of`]): the allocation id,
//! the file descriptor and the offset. The peer maps the file through `/proc/<pid>/fd/<fd>`
//! ([`PeerMaps`]) after checking that the descriptor still names the allocation with that id,
//! and keeps the mapping for later transfers.
//!
//! Nothing has a name in `/dev/shm`, so a crash leaves nothing behind: the kernel frees the
//! memory once the owner and every peer that mapped it are gone. A peer keeps at most
//! [`MAX_PEER_MAPS`] mappings of allocations it has seen; an allocation the owner has freed stays
//! mapped by a peer until that peer evicts it (ids are never reused, so a stale mapping is never
//! mistaken for a new allocation).

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rustix::fd::{AsRawFd, OwnedFd};
use rustix::fs::{MemfdFlags, Mode, OFlags};

use crate::{Error, Result};

/// Memory keys at or above this name a shared allocation: `KEY_BASE | id`.
pub const KEY_BASE: u32 = 1 << 31;

/// Bits of [`addr_of`] that hold the offset into the allocation (the descriptor sits above).
const OFFSET_BITS: u32 = 40;

/// Mappings of peers' allocations a device keeps before it evicts one.
pub const MAX_PEER_MAPS: usize = 64;

/// Prefix of the memory files' names (`/proc/<pid>/fd/<fd>` reads `/memfd:ampccl.<id> (deleted)`).
const NAME_PREFIX: &str = "ampccl.";

/// Ids of allocations, never reused in a process (31 bits; 0 is never given out).
static NEXT_ID: AtomicU32 = AtomicU32::new(1);

/// Live allocations of this process by start address.
static TABLE: RwLock<BTreeMap<usize, Entry>> = RwLock::new(BTreeMap::new());

/// Number of entries in [`TABLE`], so that [`find`], asked about every buffer of every call,
/// takes no lock in a process that allocated none. An allocation made before a call happens
/// before it (the buffer was handed to the call), so a relaxed load sees its increment.
static LIVE: AtomicUsize = AtomicUsize::new(0);

#[derive(Clone, Copy, Debug)]
struct Entry {
    len: usize,
    id: u32,
    fd: i32,
}

/// Where a buffer lies in a shared allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found {
    pub id: u32,
    pub fd: i32,
    pub offset: usize,
}

/// Zero-filled memory that the other processes of this host can map (see the module docs).
/// Freed on drop; the caller must not free it while an operation uses it (as for any buffer).
pub struct SharedMem {
    ptr: NonNull<u8>,
    len: usize,
    id: u32,
    /// Keeps the memory file open so that peers can open it through `/proc`.
    _fd: Option<OwnedFd>,
}

// SAFETY: the struct owns its mapping exclusively (as a `Vec` owns its heap memory); access to
// the contents goes through the raw pointer and is synchronised by whoever shares it.
unsafe impl Send for SharedMem {}
// SAFETY: `&SharedMem` only hands out the pointer, the length and the id.
unsafe impl Sync for SharedMem {}

impl std::fmt::Debug for SharedMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMem")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("id", &self.id)
            .finish()
    }
}

impl SharedMem {
    /// `len` zero bytes in a new memory file (page-aligned). `len == 0` allocates nothing (a
    /// dangling, aligned pointer, in no table: empty buffers need no peer access).
    pub fn new(len: usize) -> Result<SharedMem> {
        if len == 0 {
            let ptr = NonNull::new(std::ptr::without_provenance_mut(4096)).expect("non-zero");
            return Ok(SharedMem {
                ptr,
                len,
                id: 0,
                _fd: None,
            });
        }
        if len >= 1 << OFFSET_BITS {
            return Err(Error::InvalidArgument(format!(
                "shared allocation of {len} bytes (at most {} bytes)",
                (1usize << OFFSET_BITS) - 1
            )));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if id >= KEY_BASE {
            return Err(Error::InvalidUsage(
                "this process made 2^31 shared allocations".into(),
            ));
        }
        let name = format!("{NAME_PREFIX}{id}");
        let fd = rustix::fs::memfd_create(name.as_str(), MemfdFlags::CLOEXEC)
            .map_err(|e| Error::system(format!("memfd_create({name})"), e))?;
        if fd.as_raw_fd() >= 1 << (64 - OFFSET_BITS) {
            return Err(Error::InvalidUsage(format!(
                "file descriptor {} too large for a memory key",
                fd.as_raw_fd()
            )));
        }
        rustix::fs::ftruncate(&fd, len as u64)
            .map_err(|e| Error::system(format!("ftruncate({name}, {len})"), e))?;
        let ptr = super::segment::map(&name, &fd, len)?;
        let entry = Entry {
            len,
            id,
            fd: fd.as_raw_fd(),
        };
        TABLE
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(ptr.as_ptr() as usize, entry);
        LIVE.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(name, len, "allocated shared user memory");
        Ok(SharedMem {
            ptr,
            len,
            id,
            _fd: Some(fd),
        })
    }

    /// Start of the memory (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Size in bytes.
    pub fn bytes(&self) -> usize {
        self.len
    }

    /// The id peers know this allocation by (0 for an empty one).
    pub fn id(&self) -> u32 {
        self.id
    }
}

impl Drop for SharedMem {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        TABLE
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&(self.ptr.as_ptr() as usize));
        LIVE.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: the mapping made in `new`, unmapped nowhere else; it left the table above, so
        // no new transfer names it (running ones are the caller's to have finished).
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast::<c_void>(), self.len) }
        {
            tracing::warn!(id = self.id, error = %e, "cannot unmap shared user memory");
        }
    }
}

/// The allocation of this process that holds all of `[ptr, ptr + len)` (`len > 0`).
pub fn find(ptr: *const u8, len: usize) -> Option<Found> {
    if LIVE.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let start = ptr as usize;
    let end = start.checked_add(len)?;
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    let (&base, e) = table.range(..=start).next_back()?;
    (end <= base + e.len).then_some(Found {
        id: e.id,
        fd: e.fd,
        offset: start - base,
    })
}

/// The start and length of this process's allocation `id`, if it is live.
fn local(id: u32) -> Option<(usize, usize)> {
    let table = TABLE.read().unwrap_or_else(|e| e.into_inner());
    table
        .iter()
        .find(|(_, e)| e.id == id)
        .map(|(&base, e)| (base, e.len))
}

/// The memory key naming allocation `f.id`.
pub fn key_of(f: &Found) -> u32 {
    KEY_BASE | f.id
}

/// The address naming `f.offset` in the allocation held open as `f.fd`.
pub fn addr_of(f: &Found) -> u64 {
    ((f.fd as u64) << OFFSET_BITS) | f.offset as u64
}

/// A peer's allocation mapped into this process.
struct PeerMap {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: as for `SharedMem`: an owned mapping, its contents synchronised by the protocol.
unsafe impl Send for PeerMap {}
// SAFETY: as for `SharedMem`.
unsafe impl Sync for PeerMap {}

impl Drop for PeerMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `PeerMaps::open`; the last `Arc` is gone, so no transfer
        // uses it.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast::<c_void>(), self.len) };
    }
}

/// A resolved range of a peer's allocation: valid while the value lives.
pub struct Mapped {
    ptr: *mut u8,
    _map: Option<Arc<PeerMap>>,
}

impl Mapped {
    /// The first byte of the range.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }
}

/// The peers' allocations a device has mapped, by `(pid, id)`.
#[derive(Default)]
pub struct PeerMaps {
    maps: Mutex<HashMap<(u32, u32), Arc<PeerMap>>>,
}

impl PeerMaps {
    /// `[off, off + len)` of the allocation that process `pid` named `(key, addr)`, mapped here
    /// (opened at first use). Errors name the peer as `desc()` does (called only on error).
    pub fn resolve(
        &self,
        pid: u32,
        key: u32,
        addr: u64,
        len: usize,
        desc: impl Fn() -> String,
    ) -> Result<Mapped> {
        let id = key & !KEY_BASE;
        let fd = (addr >> OFFSET_BITS) as i32;
        let off = (addr & ((1 << OFFSET_BITS) - 1)) as usize;
        let bad = |what: String| Error::Remote(format!("{} named shared memory {what}", desc()));
        let check = |size: usize| {
            if off.checked_add(len).is_none_or(|end| end > size) {
                Err(bad(format!(
                    "beyond allocation {id} ({off}+{len} of {size})"
                )))
            } else {
                Ok(())
            }
        };
        if pid == std::process::id() {
            // A rank of this same process (thread mode): the allocation is in our table.
            let (base, size) = local(id).ok_or_else(|| bad(format!("{id}, which is freed")))?;
            check(size)?;
            return Ok(Mapped {
                ptr: (base + off) as *mut u8,
                _map: None,
            });
        }
        let map = self
            .mapped(pid, id, fd)
            .map_err(|e| bad(format!("{id}: {e}")))?;
        check(map.len)?;
        // SAFETY: `off + len <= map.len` (checked above).
        let ptr = unsafe { map.ptr.as_ptr().add(off) };
        Ok(Mapped {
            ptr,
            _map: Some(map),
        })
    }

    /// Allocation `id` of process `pid` (held open there as `fd`), mapped at first use; at
    /// most [`MAX_PEER_MAPS`] stay mapped.
    fn mapped(&self, pid: u32, id: u32, fd: i32) -> Result<Arc<PeerMap>> {
        let mut maps = self.maps.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = maps.get(&(pid, id)) {
            return Ok(m.clone());
        }
        let m = Arc::new(open(pid, id, fd)?);
        if maps.len() >= MAX_PEER_MAPS {
            // Any other entry: transfers using it hold their own `Arc`.
            if let Some(k) = maps.keys().next().copied() {
                maps.remove(&k);
            }
        }
        maps.insert((pid, id), m.clone());
        Ok(m)
    }
}

/// Maps allocation `id` of process `pid`, held open there as `fd`, after checking that the file
/// opened is that allocation (checked on our own descriptor, so a descriptor the owner closed
/// and reused in between cannot pass).
fn open(pid: u32, id: u32, fd: i32) -> Result<PeerMap> {
    let path = format!("/proc/{pid}/fd/{fd}");
    let file = rustix::fs::open(path.as_str(), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| Error::system(format!("open {path}"), e))?;
    let ours = format!("/proc/self/fd/{}", file.as_raw_fd());
    let target =
        std::fs::read_link(&ours).map_err(|e| Error::system(format!("readlink {ours}"), e))?;
    let want = format!("/memfd:{NAME_PREFIX}{id} ");
    if !target.to_string_lossy().starts_with(&want) {
        return Err(Error::Remote(format!(
            "{path} is {}, not allocation {id}",
            target.display()
        )));
    }
    let stat = rustix::fs::fstat(&file).map_err(|e| Error::system(format!("fstat {path}"), e))?;
    let len = usize::try_from(stat.st_size).unwrap_or(0);
    if len == 0 {
        return Err(Error::Remote(format!("{path} is empty")));
    }
    let ptr = super::segment::map(&path, &file, len)?;
    Ok(PeerMap { ptr, len })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_found_zeroed_and_forgotten_on_drop() {
        let a = SharedMem::new(10000).unwrap();
        assert_eq!(a.as_ptr() as usize % 4096, 0);
        // SAFETY: the allocation holds `len` initialised (zero) bytes.
        let bytes = unsafe { std::slice::from_raw_parts(a.as_ptr(), a.bytes()) };
        assert!(bytes.iter().all(|&b| b == 0));
        let f = find(a.as_ptr().wrapping_add(100), 9900).unwrap();
        assert_eq!((f.id, f.offset), (a.id(), 100));
        assert!(find(a.as_ptr().wrapping_add(100), 9901).is_none());
        assert!(find(a.as_ptr().wrapping_sub(1), 2).is_none());
        let p = a.as_ptr();
        drop(a);
        assert!(find(p, 1).is_none());
        let e = SharedMem::new(0).unwrap();
        assert!(e.bytes() == 0 && find(e.as_ptr(), 0).is_none());
    }

    #[test]
    fn a_peer_maps_by_key_and_checks_identity_and_bounds() {
        // Through /proc/self (a pid that is not ours in `resolve`'s eyes is needed for the
        // mapping path; the own-process path is covered by `local`).
        let a = SharedMem::new(8192).unwrap();
        let f = find(a.as_ptr(), 8192).unwrap();
        let m = open(std::process::id(), f.id, f.fd).unwrap();
        assert_eq!(m.len, 8192);
        // SAFETY: both map the same file; 8192 bytes each.
        unsafe {
            a.as_ptr().add(5).write(42);
            assert_eq!(m.ptr.as_ptr().add(5).read(), 42);
        }
        // A descriptor that is not that allocation.
        assert!(open(std::process::id(), f.id + 1, f.fd).is_err());
        let maps = PeerMaps::default();
        let own = maps
            .resolve(std::process::id(), key_of(&f), addr_of(&f) + 8, 8, || {
                "rank 1".into()
            })
            .unwrap();
        assert_eq!(own.ptr(), a.as_ptr().wrapping_add(8));
        let e = maps
            .resolve(
                std::process::id(),
                key_of(&f),
                addr_of(&f) + 8190,
                8,
                || "rank 1".into(),
            )
            .err()
            .unwrap();
        assert!(e.to_string().contains("beyond allocation"), "{e}");
        drop(a);
        assert!(
            maps.resolve(std::process::id(), key_of(&f), addr_of(&f), 8, || "rank 1"
                .into())
                .is_err()
        );
    }

    #[test]
    fn peer_mappings_are_reused_and_bounded() {
        let maps = PeerMaps::default();
        let pid = std::process::id();
        let allocs: Vec<SharedMem> = (0..MAX_PEER_MAPS + 6)
            .map(|_| SharedMem::new(4096).unwrap())
            .collect();
        let first = find(allocs[0].as_ptr(), 1).unwrap();
        let m = maps.mapped(pid, first.id, first.fd).unwrap();
        let again = maps.mapped(pid, first.id, first.fd).unwrap();
        assert!(Arc::ptr_eq(&m, &again));
        for a in &allocs {
            let f = find(a.as_ptr(), 1).unwrap();
            let pm = maps.mapped(pid, f.id, f.fd).unwrap();
            // SAFETY: both map the same 4096-byte file.
            unsafe {
                a.as_ptr().write(f.id as u8);
                assert_eq!(pm.ptr.as_ptr().read(), f.id as u8);
            }
        }
        let held = maps.maps.lock().unwrap().len();
        assert_eq!(held, MAX_PEER_MAPS);
        // An evicted mapping held by a transfer stays valid.
        // SAFETY: `m` maps 4096 bytes.
        unsafe { assert_eq!(m.ptr.as_ptr().read(), first.id as u8) };
    }
}
