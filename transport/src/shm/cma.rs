//! Cross-memory attach (CMA): copying directly between this process and another process's
//! memory with `process_vm_writev` / `process_vm_readv`, one copy instead of two through a shared
//! bounce buffer.
//!
//! The kernel allows it only if this process may ptrace the target (`PTRACE_MODE_ATTACH_REALCREDS`):
//! same user and, under Yama `ptrace_scope = 1`, the target must be a descendant (or have named us
//! with `PR_SET_PTRACER`); `ptrace_scope = 2` needs `CAP_SYS_PTRACE`, `3` forbids it. Containers
//! often lack `CAP_SYS_PTRACE` or filter the syscalls with seccomp. Hence [`probe`]: at init every
//! rank publishes the address of a word holding a random value, its peers try to read it, and the
//! transport uses CMA only if every pair succeeds (falling back to bounce buffers otherwise).

use std::ffi::c_void;
use std::io;

use crate::{Error, Result};

/// Largest piece handed to one system call (the kernel caps a transfer at `MAX_RW_COUNT`, a bit
/// under 2 GiB, anyway).
const MAX_CHUNK: usize = 1 << 30;

/// Which way a cross-memory transfer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// `process_vm_writev`: local → remote.
    Write,
    /// `process_vm_readv`: remote → local.
    Read,
}

impl Direction {
    fn syscall(self) -> &'static str {
        match self {
            Direction::Write => "process_vm_writev",
            Direction::Read => "process_vm_readv",
        }
    }
}

/// Copies `local` into process `pid` at address `remote_addr` (`remote_addr..remote_addr +
/// local.len()` must be mapped writable there).
///
/// Transfers are split into pieces of at most 1 GiB and partial transfers are resumed.
/// Errors: [`Error::InvalidArgument`] for pid 0, a pid beyond `i32`, this process's own pid
/// (writing one's own memory behind the compiler's back could clobber live Rust references —
/// copy locally instead), or an address range that overflows; [`Error::System`] with the pid and
/// errno if the kernel refuses (`EPERM`: ptrace restrictions, `ESRCH`: no such process,
/// `EFAULT`: the remote range is not mapped).
pub fn write(pid: u32, local: &[u8], remote_addr: usize) -> Result<()> {
    let target = check_pid(pid)?;
    if pid == std::process::id() {
        return Err(Error::InvalidArgument(format!(
            "cma::write to this process itself (pid {pid}); copy locally instead"
        )));
    }
    // SAFETY: the kernel only reads `local`, which is a valid shared borrow for its length.
    unsafe {
        transfer(
            Direction::Write,
            target,
            local.as_ptr().cast_mut(),
            local.len(),
            remote_addr,
            MAX_CHUNK,
        )
    }
}

/// Copies `local.len()` bytes from address `remote_addr` of process `pid` into `local`.
///
/// Same splitting, resumption and errors as [`write()`] (reading one's own pid is allowed).
pub fn read(pid: u32, local: &mut [u8], remote_addr: usize) -> Result<()> {
    read_chunked(pid, local, remote_addr, MAX_CHUNK)
}

fn read_chunked(pid: u32, local: &mut [u8], remote_addr: usize, max_chunk: usize) -> Result<()> {
    let target = check_pid(pid)?;
    // SAFETY: the kernel writes only into `local`, which we borrow exclusively for its length.
    unsafe {
        transfer(
            Direction::Read,
            target,
            local.as_mut_ptr(),
            local.len(),
            remote_addr,
            max_chunk,
        )
    }
}

/// Tries to read the 8-byte word at `remote_addr` of process `pid`; `true` iff the read works and
/// the word (native byte order) equals `expected`. Failures are logged at debug level with the
/// reason.
pub fn probe(pid: u32, remote_addr: usize, expected: u64) -> bool {
    let mut word = [0u8; 8];
    match read(pid, &mut word, remote_addr) {
        Ok(()) => {
            let got = u64::from_ne_bytes(word);
            if got != expected {
                tracing::debug!(
                    pid,
                    remote_addr,
                    expected,
                    got,
                    "CMA probe read an unexpected value (wrong address or process)"
                );
            }
            got == expected
        }
        Err(e) => {
            tracing::debug!(pid, remote_addr, error = %e, "CMA probe failed; CMA unavailable for this peer");
            false
        }
    }
}

fn check_pid(pid: u32) -> Result<libc::pid_t> {
    match libc::pid_t::try_from(pid) {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(Error::InvalidArgument(format!("invalid pid {pid} for CMA"))),
    }
}

/// Explains the errno values that mean "CMA is not usable here" rather than a bug.
fn hint(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => {
            " (ptrace restrictions: Yama kernel.yama.ptrace_scope, or missing CAP_SYS_PTRACE in a container)"
        }
        libc::ESRCH => " (no such process)",
        libc::EFAULT => " (remote address range not mapped)",
        libc::ENOSYS => " (CMA not supported by the kernel or blocked by seccomp)",
        _ => "",
    }
}

/// Moves `len` bytes between `local` and `remote_addr` of `pid` in pieces of at most `max_chunk`
/// bytes, resuming partial transfers.
///
/// # Safety
/// For [`Direction::Write`], `local..local+len` must be valid for reads; for
/// [`Direction::Read`], valid for writes and not aliased by any live reference.
unsafe fn transfer(
    dir: Direction,
    pid: libc::pid_t,
    local: *mut u8,
    len: usize,
    remote_addr: usize,
    max_chunk: usize,
) -> Result<()> {
    if remote_addr.checked_add(len).is_none() {
        return Err(Error::InvalidArgument(format!(
            "CMA range {remote_addr:#x} + {len} overflows the address space"
        )));
    }
    let max_chunk = max_chunk.clamp(1, MAX_CHUNK);
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(max_chunk);
        let local_iov = libc::iovec {
            // SAFETY: `done < len`, so the offset stays inside the caller's buffer.
            iov_base: unsafe { local.add(done) }.cast::<c_void>(),
            iov_len: n,
        };
        let remote_iov = libc::iovec {
            iov_base: (remote_addr + done) as *mut c_void,
            iov_len: n,
        };
        // SAFETY: `local_iov` covers `n` bytes of the caller's buffer, valid for the direction as
        // the caller guarantees; the remote iovec is only interpreted by the kernel in the other
        // process (an invalid one yields EFAULT, not UB here).
        let rc = unsafe {
            match dir {
                Direction::Write => libc::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0),
                Direction::Read => libc::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0),
            }
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            let errno = e.raw_os_error().unwrap_or(0);
            if errno == libc::EINTR {
                continue;
            }
            return Err(Error::System(format!(
                "{}(pid {pid}, remote {:#x}, {n} of {len} bytes at offset {done}): {e}{}",
                dir.syscall(),
                remote_addr + done,
                hint(errno)
            )));
        }
        if rc == 0 {
            return Err(Error::System(format!(
                "{}(pid {pid}, remote {:#x}): no progress after {done} of {len} bytes",
                dir.syscall(),
                remote_addr + done
            )));
        }
        done += rc as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::segment::test_support::*;
    use std::io::{BufRead, BufReader, Write as _};

    #[test]
    fn probe_own_process() {
        let word: Box<u64> = Box::new(0x0123_4567_89ab_cdef);
        let addr = &*word as *const u64 as usize;
        assert!(probe(std::process::id(), addr, 0x0123_4567_89ab_cdef));
        assert!(!probe(std::process::id(), addr, 0x0123_4567_89ab_cdee));
    }

    #[test]
    fn read_own_process_in_small_chunks() {
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 13 % 256) as u8).collect();
        for chunk in [1, 7, 4096, 9_999, 10_000, 1 << 20] {
            let mut dst = vec![0u8; src.len()];
            read_chunked(std::process::id(), &mut dst, src.as_ptr() as usize, chunk).unwrap();
            assert_eq!(dst, src, "chunk {chunk}");
        }
        let mut empty = [0u8; 0];
        read(std::process::id(), &mut empty, 0).unwrap();
    }

    #[test]
    fn invalid_arguments() {
        let mut buf = [0u8; 8];
        assert!(matches!(
            read(0, &mut buf, 0x1000),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            read(u32::MAX, &mut buf, 0x1000),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            read(std::process::id(), &mut buf, usize::MAX - 3),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            write(std::process::id(), &buf, buf.as_ptr() as usize),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn errors_carry_pid_and_errno() {
        let dead = dead_pid();
        let mut buf = [0u8; 8];
        match read(dead, &mut buf, 0x1000) {
            Err(Error::System(msg)) => {
                assert!(msg.contains(&format!("pid {dead}")), "{msg}");
                assert!(msg.contains("os error"), "{msg}");
            }
            other => panic!("expected System error, got {other:?}"),
        }
        // Unmapped address in our own process: EFAULT.
        match read(std::process::id(), &mut buf, 8) {
            Err(Error::System(msg)) => assert!(msg.contains("not mapped"), "{msg}"),
            other => panic!("expected System error, got {other:?}"),
        }
        assert!(!probe(dead, 0x1000, 0));
    }

    const BUF_LEN: usize = 3 * 4096 + 11;
    const WORD_VAR: &str = "AMPCCL_TEST_CMA_WORD";

    fn initial(i: usize) -> u8 {
        (i % 256) as u8
    }
    fn written(i: usize) -> u8 {
        (i * 31 % 256) as u8 ^ 0x5A
    }

    /// Child role "cma-target": publishes its pid and the addresses of a buffer and a word, then
    /// waits for a line on stdin and checks the buffer holds what the parent wrote with CMA.
    #[test]
    fn child_cma_target() {
        if child_role().as_deref() != Some("cma-target") {
            return;
        }
        // Watchdog: never outlive a parent that stopped talking to us.
        std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_secs(60));
            eprintln!("cma-target: no word from the parent in 60 s, exiting");
            std::process::exit(2);
        });
        let word_value: u64 = std::env::var(WORD_VAR).unwrap().parse().unwrap();
        let word = Box::new(word_value);
        let mut buf: Vec<u8> = (0..BUF_LEN).map(initial).collect();
        let buf_ptr = std::hint::black_box(buf.as_mut_ptr());
        let word_ptr = std::hint::black_box(&*word as *const u64);
        println!(
            "AMPCCL_CHILD {} {} {}",
            std::process::id(),
            buf_ptr as usize,
            word_ptr as usize
        );
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        let expect_written = line.trim() == "check";
        for i in 0..BUF_LEN {
            // SAFETY: `buf` is live; volatile because another process changed it behind the
            // compiler's back.
            let got = unsafe { buf_ptr.add(i).read_volatile() };
            let want = if expect_written {
                written(i)
            } else {
                initial(i)
            };
            assert_eq!(got, want, "byte {i}");
        }
        println!("AMPCCL_CHILD verified {}", line.trim());
        drop(buf);
        drop(word);
    }

    /// Child role "cma-sibling": probes, writes to and reads from a sibling "cma-target".
    #[test]
    fn child_cma_sibling() {
        if child_role().as_deref() != Some("cma-sibling") {
            return;
        }
        let var = |k: &str| std::env::var(k).unwrap().parse::<u64>().unwrap();
        let pid = var("AMPCCL_TEST_SIB_PID") as u32;
        let buf = var("AMPCCL_TEST_SIB_BUF") as usize;
        let word = var("AMPCCL_TEST_SIB_WORD") as usize;
        let value = var(WORD_VAR);
        if !probe(pid, word, value) {
            let mut b = [0u8; 8];
            println!("AMPCCL_CHILD sibling-denied {:?}", read(pid, &mut b, word));
            return;
        }
        assert!(!probe(pid, word, value ^ 1));
        let mut got = vec![0u8; BUF_LEN];
        read(pid, &mut got, buf).unwrap();
        assert!(got.iter().enumerate().all(|(i, &b)| b == initial(i)));
        let data: Vec<u8> = (0..BUF_LEN).map(written).collect();
        write(pid, &data, buf).unwrap();
        println!("AMPCCL_CHILD sibling-ok");
    }

    struct Target {
        guard: ChildGuard,
        lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
        pid: u32,
        buf: usize,
        word: usize,
        value: u64,
    }

    fn spawn_target() -> Target {
        let value: u64 = rand::random();
        let mut guard = ChildGuard(Some(spawn_child(
            &test_name(module_path!(), "child_cma_target"),
            "cma-target",
            &[(WORD_VAR, value.to_string())],
        )));
        let stdout = guard.child().stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let header = loop {
            let line = lines
                .next()
                .expect("child exited before publishing")
                .unwrap();
            if let Some(rest) = report(&line) {
                break rest.to_owned();
            }
        };
        let f: Vec<usize> = header
            .split_whitespace()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(f[0] as u32, guard.child().id());
        Target {
            guard,
            lines,
            pid: f[0] as u32,
            buf: f[1],
            word: f[2],
            value,
        }
    }

    impl Target {
        /// Tells the child whether to expect the written pattern, waits, and checks it verified.
        fn finish(mut self, expect_written: bool) {
            let msg = if expect_written { "check" } else { "initial" };
            let stdin = self.guard.child().stdin.as_mut().unwrap();
            writeln!(stdin, "{msg}").unwrap();
            stdin.flush().unwrap();
            let rest: Vec<String> = self.lines.by_ref().map(|l| l.unwrap()).collect();
            let status = self.guard.wait();
            assert!(status.success(), "target failed: {status:?} {rest:#?}");
            let want = format!("verified {msg}");
            assert!(rest.iter().any(|l| report(l) == Some(&want)), "{rest:#?}");
        }
    }

    #[test]
    fn cma_parent_to_child() {
        if child_role().is_some() {
            return;
        }
        let t = spawn_target();
        if !probe(t.pid, t.word, t.value) {
            let mut b = [0u8; 8];
            let err = read(t.pid, &mut b, t.word).unwrap_err();
            let msg = err.to_string();
            eprintln!("CMA parent->child unavailable here, skipping data checks: {msg}");
            assert!(
                msg.contains("ptrace") || msg.contains("seccomp"),
                "unexpected CMA failure: {msg}"
            );
            t.finish(false);
            return;
        }
        assert!(!probe(t.pid, t.word, t.value.wrapping_add(1)));
        assert!(!probe(t.pid, 8, t.value), "unmapped address");
        let mut got = vec![0u8; BUF_LEN];
        read(t.pid, &mut got, t.buf).unwrap();
        assert!(
            got.iter().enumerate().all(|(i, &b)| b == initial(i)),
            "read the child's initial buffer"
        );
        let data: Vec<u8> = (0..BUF_LEN).map(written).collect();
        write(t.pid, &data, t.buf).unwrap();
        let mut back = vec![0u8; BUF_LEN];
        read(t.pid, &mut back, t.buf).unwrap();
        assert_eq!(back, data);
        // Writes beyond the child's mappings fail with EFAULT context.
        assert!(matches!(write(t.pid, &data, 8), Err(Error::System(_))));
        let pid = t.pid;
        t.finish(true);
        // The child has exited and been reaped: the probe must now fail.
        assert!(!probe(pid, 0x1000, 0));
    }

    #[test]
    fn cma_between_siblings() {
        if child_role().is_some() {
            return;
        }
        let t = spawn_target();
        let mut sib = ChildGuard(Some(spawn_child(
            &test_name(module_path!(), "child_cma_sibling"),
            "cma-sibling",
            &[
                ("AMPCCL_TEST_SIB_PID", t.pid.to_string()),
                ("AMPCCL_TEST_SIB_BUF", t.buf.to_string()),
                ("AMPCCL_TEST_SIB_WORD", t.word.to_string()),
                (WORD_VAR, t.value.to_string()),
            ],
        )));
        let stdout = sib.child().stdout.take().unwrap();
        let lines: Vec<String> = BufReader::new(stdout).lines().map(|l| l.unwrap()).collect();
        let status = sib.wait();
        assert!(status.success(), "sibling failed: {status:?} {lines:#?}");
        if lines.iter().any(|l| report(l) == Some("sibling-ok")) {
            eprintln!("CMA between sibling processes works here");
            t.finish(true);
        } else {
            let denied = lines
                .iter()
                .find(|l| report(l).is_some_and(|r| r.starts_with("sibling-denied")))
                .unwrap_or_else(|| panic!("sibling did not run its role: {lines:#?}"));
            eprintln!("CMA between sibling processes unavailable here: {denied}");
            assert!(
                denied.contains("ptrace") || denied.contains("seccomp"),
                "unexpected failure: {denied}"
            );
            t.finish(false);
        }
    }
}
