//! A client of the PMI-1 "simple" wire protocol, which MPICH-family launchers offer their
//! processes on the inherited socket `PMI_FD`: Intel MPI's and MPICH's `mpirun` (hydra), and
//! Slurm's `srun --mpi=pmi2` (whose plugin answers PMI-1 clients too). The launcher also sets
//! `PMI_RANK` and `PMI_SIZE`; the key-value space (KVS) it keeps for the job carries the
//! unique id: rank 0 puts it, every rank enters a barrier, the others get it.
//!
//! # Wire protocol
//!
//! Text lines, each `cmd=<name>` then space-separated `key=value` fields, ended by `\n`:
//!
//! | request | reply |
//! |---|---|
//! | `cmd=init pmi_version=1 pmi_subversion=1` | `cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0` |
//! | `cmd=get_maxes` | `cmd=maxes kvsname_max=N keylen_max=N vallen_max=N rc=0` |
//! | `cmd=get_my_kvsname` | `cmd=my_kvsname kvsname=NAME rc=0` |
//! | `cmd=put kvsname=NAME key=K value=V` | `cmd=put_result rc=0` |
//! | `cmd=barrier_in` | `cmd=barrier_out` (once every process entered) |
//! | `cmd=get kvsname=NAME key=K` | `cmd=get_result rc=0 value=V` (`rc` non-zero: no such key) |
//! | `cmd=finalize` | `cmd=finalize_ack` |
//!
//! A non-zero `rc` is an error (its `msg` is quoted). Replies are read with the caller's
//! deadline, a line longer than [`MAX_LINE`] is refused before it grows further, and keys and
//! values are checked against the launcher's maxima and for characters the format cannot carry
//! (space, `=`, newline).
//!
//! One process speaks PMI once: the session (init, maxes, KVS name) is kept for the process's
//! life, every later rendezvous uses a fresh key (`ampccl-uid-<n>`), and an `atexit` handler
//! sends `finalize` (hydra takes a process that exits without it for a crashed one and kills
//! the job). A program that calls
//! `MPI_Init` itself owns `PMI_FD`; it should broadcast a [`UniqueId`](super::UniqueId) with
//! MPI and call `Communicator::init` instead of `from_env`.

use std::collections::HashMap;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Instant;

use ampccl_runtime::{Error, Result};

use super::wire::{is_timeout, remaining};

/// Longest reply line accepted.
pub const MAX_LINE: usize = 64 * 1024;

/// An initialized PMI-1 session.
#[derive(Debug)]
pub struct Pmi {
    stream: UnixStream,
    /// Bytes read past the last line.
    pending: Vec<u8>,
    kvsname: String,
    keylen_max: usize,
    vallen_max: usize,
}

impl Pmi {
    /// Initializes PMI-1 over `stream` (the socket of `PMI_FD`): `init`, `get_maxes`,
    /// `get_my_kvsname`.
    pub fn init(stream: UnixStream, deadline: Instant) -> Result<Pmi> {
        stream
            .set_nonblocking(false)
            .map_err(|e| Error::system("PMI: PMI_FD socket", e))?;
        let mut pmi = Pmi {
            stream,
            pending: Vec::new(),
            kvsname: String::new(),
            keylen_max: 0,
            vallen_max: 0,
        };
        let r = pmi.request(
            "cmd=init pmi_version=1 pmi_subversion=1",
            "response_to_init",
            deadline,
        )?;
        if r.get("pmi_version").map(String::as_str) != Some("1") {
            return Err(Error::Remote(format!(
                "PMI: the launcher answered init with version {:?}, not 1",
                r.get("pmi_version")
            )));
        }
        let r = pmi.request("cmd=get_maxes", "maxes", deadline)?;
        let max = |k: &str| -> Result<usize> {
            r.get(k)
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|&n| n > 0)
                .map(|n| n.min(MAX_LINE))
                .ok_or_else(|| Error::Remote(format!("PMI: get_maxes: no valid {k} in {r:?}")))
        };
        pmi.keylen_max = max("keylen_max")?;
        pmi.vallen_max = max("vallen_max")?;
        let kvsname_max = max("kvsname_max")?;
        let r = pmi.request("cmd=get_my_kvsname", "my_kvsname", deadline)?;
        pmi.kvsname = r
            .get("kvsname")
            .filter(|n| !n.is_empty() && n.len() <= kvsname_max && token_ok(n))
            .cloned()
            .ok_or_else(|| Error::Remote(format!("PMI: get_my_kvsname: bad reply {r:?}")))?;
        Ok(pmi)
    }

    /// The job's KVS name.
    pub fn kvsname(&self) -> &str {
        &self.kvsname
    }

    /// Puts `key=value` into the job's KVS (visible to the others after a [`Pmi::barrier`]).
    pub fn put(&mut self, key: &str, value: &str, deadline: Instant) -> Result<()> {
        self.check("key", key, self.keylen_max)?;
        self.check("value", value, self.vallen_max)?;
        let line = format!("cmd=put kvsname={} key={key} value={value}", self.kvsname);
        self.request(&line, "put_result", deadline).map(drop)
    }

    /// Returns once every process of the job entered the barrier.
    pub fn barrier(&mut self, deadline: Instant) -> Result<()> {
        self.request("cmd=barrier_in", "barrier_out", deadline)
            .map(drop)
    }

    /// The value of `key` in the job's KVS.
    pub fn get(&mut self, key: &str, deadline: Instant) -> Result<String> {
        self.check("key", key, self.keylen_max)?;
        let line = format!("cmd=get kvsname={} key={key}", self.kvsname);
        let r = self.request(&line, "get_result", deadline)?;
        r.get("value")
            .cloned()
            .ok_or_else(|| Error::Remote(format!("PMI: get {key}: no value in {r:?}")))
    }

    /// Ends the session (the launcher then expects no more requests).
    pub fn finalize(mut self, deadline: Instant) -> Result<()> {
        self.request("cmd=finalize", "finalize_ack", deadline)
            .map(drop)
    }

    fn check(&self, what: &str, s: &str, max: usize) -> Result<()> {
        if s.is_empty() || s.len() > max || !token_ok(s) {
            return Err(Error::InvalidArgument(format!(
                "PMI: {what} {s:?} is empty, longer than the launcher's {max} bytes or holds a \
                 space, '=' or control character"
            )));
        }
        Ok(())
    }

    /// Sends `line` and reads the reply, which must be `cmd=<expect>` with `rc` 0 if present.
    fn request(
        &mut self,
        line: &str,
        expect: &str,
        deadline: Instant,
    ) -> Result<HashMap<String, String>> {
        let first = line.split(' ').next().unwrap_or(line);
        let fail = |e: io::Error| Error::Remote(format!("PMI: {first}: {e}"));
        self.stream
            .set_write_timeout(remaining(deadline))
            .map_err(fail)?;
        send_all(&self.stream, format!("{line}\n").as_bytes())
            .map_err(|e| self.io_fail(first, e))?;
        let reply = self.read_line(first, deadline)?;
        let fields = parse_line(&reply);
        if fields.get("cmd").map(String::as_str) != Some(expect) {
            return Err(Error::Remote(format!(
                "PMI: {first}: expected cmd={expect}, the launcher answered {reply:?}"
            )));
        }
        match fields.get("rc").map(String::as_str) {
            None | Some("0") => Ok(fields),
            Some(rc) => Err(Error::Remote(format!(
                "PMI: {first}: the launcher answered rc={rc} ({})",
                fields.get("msg").map_or("no message", String::as_str)
            ))),
        }
    }

    fn io_fail(&self, what: &str, e: io::Error) -> Error {
        if is_timeout(&e) {
            Error::Timeout(format!("PMI: {what}: no reply from the launcher in time"))
        } else {
            Error::Remote(format!("PMI: {what}: {e}"))
        }
    }

    fn read_line(&mut self, what: &str, deadline: Instant) -> Result<String> {
        loop {
            if let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=i).collect();
                return Ok(String::from_utf8_lossy(&line[..i]).into_owned());
            }
            if self.pending.len() > MAX_LINE {
                return Err(Error::Remote(format!(
                    "PMI: {what}: a reply line longer than {MAX_LINE} bytes"
                )));
            }
            let left = remaining(deadline).ok_or_else(|| {
                Error::Timeout(format!("PMI: {what}: no reply from the launcher in time"))
            })?;
            self.stream
                .set_read_timeout(Some(left))
                .map_err(|e| Error::system("PMI: socket", e))?;
            let mut buf = [0u8; 4096];
            match self.stream.read(&mut buf) {
                Ok(0) => {
                    return Err(Error::Remote(format!(
                        "PMI: {what}: the launcher closed PMI_FD"
                    )));
                }
                Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The loop re-checks the deadline.
                Err(e) if is_timeout(&e) => {}
                Err(e) => return Err(self.io_fail(what, e)),
            }
        }
    }
}

/// Writes all of `bytes` with `MSG_NOSIGNAL`: a launcher that closed the socket is an error,
/// never a `SIGPIPE` (which a C program calling in through the C ABI may not ignore). Bounded by
/// the socket's write timeout.
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid readable buffer of `bytes.len()` bytes for the call, and
        // the descriptor belongs to `stream`, open for the call.
        let n = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// Whether `s` can travel as one PMI field value.
fn token_ok(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_graphic() && b != b'=')
}

/// `key=value` fields of one line; a field without `=` is ignored.
fn parse_line(line: &str) -> HashMap<String, String> {
    line.split_ascii_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[cfg(test)]
#[path = "pmi_tests.rs"]
mod tests;
