//! Low-level helpers of the bootstrap: deadline-bounded socket I/O, little-endian field
//! encoding, and the stable (process-independent) FNV-1a hashes used for host ids and derived
//! tokens.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::RawFd;
use std::ptr::null;
use std::time::{Duration, Instant};

/// Largest payload of a bootstrap message; a larger length is a malformed frame.
pub(crate) const MAX_PAYLOAD: u64 = 1 << 30;
/// How often a wait re-checks that the peers it waits for still exist (see [`process_gone`]).
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(100);

/// Why a deadline-bounded I/O failed.
#[derive(Debug)]
pub(crate) enum IoFail {
    /// The deadline passed.
    Timeout,
    /// The peer closed the connection (EOF), after `usize` bytes of the requested buffer.
    Closed(usize),
    /// Any other socket error.
    Other(io::Error),
    /// The peer's process no longer exists (the reason says how we know).
    Gone(String),
}

impl std::fmt::Display for IoFail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IoFail::Timeout => write!(f, "timed out"),
            IoFail::Closed(0) => write!(f, "connection closed"),
            IoFail::Closed(n) => write!(f, "connection closed after {n} bytes of a frame"),
            IoFail::Other(e) => write!(f, "{e}"),
            IoFail::Gone(why) => write!(f, "{why}"),
        }
    }
}

/// Time left until `deadline`, `None` once it has passed.
pub(crate) fn remaining(deadline: Instant) -> Option<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then_some(left)
}

pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// Reads into `buf[*filled..]` until full or until `deadline`; `*filled` tracks progress so a
/// timed-out read can be resumed later without losing bytes.
pub(crate) fn read_resumable(
    stream: &mut TcpStream,
    buf: &mut [u8],
    filled: &mut usize,
    deadline: Instant,
) -> Result<(), IoFail> {
    while *filled < buf.len() {
        let left = remaining(deadline).ok_or(IoFail::Timeout)?;
        stream.set_read_timeout(Some(left)).map_err(IoFail::Other)?;
        match stream.read(&mut buf[*filled..]) {
            Ok(0) => return Err(IoFail::Closed(*filled)),
            Ok(n) => *filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if is_timeout(&e) => {}
            Err(e) => return Err(IoFail::Other(e)),
        }
    }
    Ok(())
}

/// Fills `buf` before `deadline`.
pub(crate) fn read_exact_by(
    stream: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
) -> Result<(), IoFail> {
    let mut filled = 0;
    read_resumable(stream, buf, &mut filled, deadline)
}

/// Writes all of `bufs` (in order) before `deadline`.
pub(crate) fn write_all_by(
    stream: &mut TcpStream,
    bufs: &[&[u8]],
    deadline: Instant,
) -> Result<(), IoFail> {
    write_all_watched(stream, bufs, deadline, &|| None)
}

/// [`write_all_by`] that, while the socket does not take more bytes, asks `gone` every
/// [`CHECK_EVERY`] whether the peer's process still exists, and gives up with
/// [`IoFail::Gone`] when it says why not (a dead peer whose socket another process keeps open
/// would otherwise hold the write until `deadline`).
pub(crate) fn write_all_watched(
    stream: &mut TcpStream,
    bufs: &[&[u8]],
    deadline: Instant,
    gone: &dyn Fn() -> Option<String>,
) -> Result<(), IoFail> {
    for buf in bufs {
        let mut done = 0;
        while done < buf.len() {
            let left = remaining(deadline).ok_or(IoFail::Timeout)?;
            stream
                .set_write_timeout(Some(left.min(CHECK_EVERY)))
                .map_err(IoFail::Other)?;
            match stream.write(&buf[done..]) {
                Ok(0) => return Err(IoFail::Closed(0)),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if is_timeout(&e) => {
                    if let Some(why) = gone() {
                        return Err(IoFail::Gone(why));
                    }
                }
                Err(e) => return Err(IoFail::Other(e)),
            }
        }
    }
    Ok(())
}

/// `ppoll(2)` for readability over `fds`, at most `timeout` (to the nanosecond the kernel's
/// timers give, and at most a second): entry `i` of the result says whether
/// `fds[i]` is readable, hung up or in error (a read will not block). An interrupted poll
/// reports nothing ready.
pub(crate) fn poll_readable(fds: &[RawFd], timeout: Duration) -> io::Result<Vec<bool>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let timeout = timeout.min(Duration::from_secs(1));
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: `pfds` is a valid array of `pfds.len()` pollfd structures and `ts` a valid
    // timespec for the whole call; a null signal mask leaves the thread's mask as it is.
    let n = unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, &ts, null()) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    let ready = libc::POLLIN | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL;
    Ok(pfds.iter().map(|p| p.revents & ready != 0).collect())
}

/// Reads what is available from a non-blocking stream into `buf[*filled..]`: `Ok(true)` once
/// `buf` is full, `Ok(false)` if more is to come, [`IoFail::Closed`] at end of stream.
pub(crate) fn read_available(
    stream: &mut TcpStream,
    buf: &mut [u8],
    filled: &mut usize,
) -> Result<bool, IoFail> {
    while *filled < buf.len() {
        match stream.read(&mut buf[*filled..]) {
            Ok(0) => return Err(IoFail::Closed(*filled)),
            Ok(n) => *filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(IoFail::Other(e)),
        }
    }
    Ok(true)
}

/// Cursor that reads little-endian fields out of a fixed frame.
pub(crate) struct Fields<'a>(pub &'a [u8]);

impl<'a> Fields<'a> {
    pub(crate) fn take(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    pub(crate) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    pub(crate) fn u128(&mut self) -> u128 {
        u128::from_le_bytes(self.take(16).try_into().expect("16 bytes"))
    }
}

/// 64-bit FNV-1a over `parts`, each followed by a zero separator byte.
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(&[0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// 128-bit FNV-1a over `parts`, each followed by a zero separator byte.
pub(crate) fn fnv1a128(parts: &[&[u8]]) -> u128 {
    let mut h: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    for part in parts {
        for &b in part.iter().chain(&[0u8]) {
            h ^= u128::from(b);
            h = h.wrapping_mul(0x0000_0000_0100_0000_0000_0000_0000_013b);
        }
    }
    h
}

/// Identifier of this host: FNV-1a of the hostname and the kernel boot id
/// (`/proc/sys/kernel/random/boot_id`), so two containers or reboots of one name still differ;
/// `AMPCCL_HOSTID`, where set, replaces both (as `NCCL_HOSTID` does: ranks that set the same
/// value count as one host).
pub fn host_id() -> u64 {
    host_id_from(std::env::var("AMPCCL_HOSTID").ok())
}

/// [`host_id`] with the value of `AMPCCL_HOSTID` given.
fn host_id_from(override_id: Option<String>) -> u64 {
    if let Some(id) = override_id.filter(|v| !v.is_empty()) {
        return fnv1a64(&[b"AMPCCL_HOSTID", id.as_bytes()]);
    }
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_owned()).ok();
    let hostname = read("/proc/sys/kernel/hostname")
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let boot_id = read("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    fnv1a64(&[hostname.as_bytes(), boot_id.as_bytes()])
}

/// Identifier of this process's PID namespace: the low 32 bits of the FNV-1a of the
/// `/proc/self/ns/pid` link (`pid:[4026531836]`), never 0; 0 when it cannot be read. Two ranks
/// with the same [`host_id`] and the same non-zero namespace id see each other's pids, so one
/// can tell whether the other's process still exists ([`process_gone`]).
pub(crate) fn pid_namespace() -> u32 {
    match std::fs::read_link("/proc/self/ns/pid") {
        Ok(link) => {
            let h = fnv1a64(&[link.as_os_str().as_encoded_bytes()]) as u32;
            h.max(1)
        }
        Err(_) => 0,
    }
}

/// Whether process `pid` (of our PID namespace) is known to have exited: `kill(pid, 0)` says it
/// does not exist, or `/proc/<pid>/stat` shows a zombie (exited, not yet reaped by its parent,
/// which still answers `kill`). A process we may not signal (`EPERM`) exists. The pid could in
/// principle be reused by an unrelated process; that only delays the detection to the timeout.
pub(crate) fn process_gone(pid: u32) -> bool {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else {
        return false;
    };
    // Any other answer (`EPERM` included) means the process exists.
    if let Err(rustix::io::Errno::SRCH) = rustix::process::test_kill_process(p) {
        return true;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name, which may itself contain ')'.
        Ok(stat) => matches!(
            stat.rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().next()),
            Some("Z" | "X")
        ),
        Err(e) => e.kind() == io::ErrorKind::NotFound,
    }
}

/// Sets `TCP_NODELAY` and blocking mode on a bootstrap socket.
pub(crate) fn prepare(stream: &TcpStream) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_stable_and_separated() {
        assert_eq!(fnv1a64(&[]), 0xcbf2_9ce4_8422_2325);
        assert_ne!(fnv1a64(&[b"ab", b"c"]), fnv1a64(&[b"a", b"bc"]));
        assert_ne!(fnv1a128(&[b"ab", b"c"]), fnv1a128(&[b"a", b"bc"]));
        assert_eq!(host_id(), host_id());
        // AMPCCL_HOSTID replaces the hostname and boot id; empty is unset.
        let a = host_id_from(Some("rack1-node7".into()));
        assert_eq!(a, host_id_from(Some("rack1-node7".into())));
        assert_ne!(a, host_id_from(Some("rack1-node8".into())));
        assert_ne!(a, host_id_from(None));
        assert_eq!(host_id_from(Some(String::new())), host_id_from(None));
        assert_eq!(pid_namespace(), pid_namespace());
    }

    #[test]
    fn exited_and_zombie_processes_are_gone() {
        assert!(!process_gone(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let t = Instant::now();
        // Exited but not reaped yet: a zombie.
        while !process_gone(pid) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "child {pid} never exited"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        child.wait().unwrap();
        assert!(process_gone(pid));
    }
}
