//! The io_uring send path (cargo feature `io-uring`, `AMPCCL_TCP_IO=uring`): large payloads
//! leave through `IORING_OP_SENDMSG_ZC`, the kernel sending from our pages instead of copying
//! them into socket buffers first; the stripes of a striped write are all submitted at once
//! and complete in any order (no `poll` round robin).
//!
//! A zero-copy send completes twice: once with the byte count (flagged "more" when the kernel
//! still holds our pages), once more with a notification when it lets them go. A send returns
//! only after both, so a write's memory is the caller's again when the write returns, as with
//! `sendmsg`. Where the kernel or a container's seccomp profile refuses io_uring (or lacks
//! `SENDMSG_ZC`), [`Ring::new`] fails and the provider stays on `sendmsg` with one log line.

use std::io::IoSlice;
use std::sync::Mutex;

use io_uring::{IoUring, Probe, cqueue, opcode, types};

use super::peer::lock;
use super::stripe::Job;

/// Smallest payload worth a zero-copy send (pinning pages and a second completion cost more
/// than copying a few pages).
pub const ZC_MIN: usize = 64 << 10;

/// One ring per device, shared by its senders (one send at a time).
pub struct Ring {
    ring: Mutex<IoUring>,
}

impl Ring {
    /// A ring that supports `SENDMSG_ZC`, or why not.
    pub fn new() -> std::io::Result<Ring> {
        let ring = IoUring::new(64)?;
        let mut probe = Probe::new();
        ring.submitter().register_probe(&mut probe)?;
        if !probe.is_supported(opcode::SendMsgZc::CODE) {
            return Err(std::io::Error::other(
                "the kernel has no IORING_OP_SENDMSG_ZC",
            ));
        }
        Ok(Ring {
            ring: Mutex::new(ring),
        })
    }

    /// Sends every job whole, all submitted at once; returns when every byte is sent and the
    /// kernel has released every page (the first error ends it: the connection is lost).
    pub fn send(&self, jobs: &mut [Job<'_>]) -> std::io::Result<()> {
        let mut ring = lock(&self.ring);
        // The message headers stay where they are until their sends complete.
        // SAFETY: `msghdr` is plain data, all zeros an empty message without an address.
        let mut msgs: Vec<libc::msghdr> = vec![unsafe { std::mem::zeroed() }; jobs.len()];
        let mut in_flight = 0usize;
        let mut notifications = 0usize;
        for i in 0..jobs.len() {
            if !jobs[i].done() {
                submit(&mut ring, &mut msgs[i], &jobs[i], i)?;
                in_flight += 1;
            }
        }
        let mut failure = None;
        while in_flight > 0 || notifications > 0 {
            ring.submit_and_wait(1)?;
            let done: Vec<(u64, i32, u32)> = ring
                .completion()
                .map(|c| (c.user_data(), c.result(), c.flags()))
                .collect();
            for (i, result, flags) in done {
                if cqueue::notif(flags) {
                    notifications -= 1;
                    continue;
                }
                in_flight -= 1;
                if cqueue::more(flags) {
                    notifications += 1;
                }
                let job = &mut jobs[i as usize];
                match result {
                    n if n >= 0 => job.advance(n as usize),
                    e if -e == libc::EINTR || -e == libc::EAGAIN => {}
                    e => {
                        failure.get_or_insert(std::io::Error::from_raw_os_error(-e));
                        continue;
                    }
                }
                if !job.done() && failure.is_none() {
                    submit(&mut ring, &mut msgs[i as usize], job, i as usize)?;
                    in_flight += 1;
                }
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

/// Queues one `SENDMSG_ZC` of what is left of `job`, described by `msg`.
fn submit(
    ring: &mut IoUring,
    msg: &mut libc::msghdr,
    job: &Job<'_>,
    i: usize,
) -> std::io::Result<()> {
    let rest: &[IoSlice<'_>] = job.rest();
    msg.msg_iov = rest.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = rest.len() as _;
    let sqe = opcode::SendMsgZc::new(types::Fd(job.fd), msg)
        .flags(libc::MSG_NOSIGNAL as u32)
        .build()
        .user_data(i as u64);
    // SAFETY: `msg`, the iovecs it names and the bytes they point to stay valid and untouched
    // until the send's completions (both) are reaped in `Ring::send`, which waits for them.
    while unsafe { ring.submission().push(&sqe) }.is_err() {
        ring.submit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Several sockets, each with more than its buffer holds, through the ring: every byte
    /// arrives in order on its socket (skipped where io_uring is refused).
    #[test]
    fn ring_sends_deliver_every_job_whole() {
        let ring = match Ring::new() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("io_uring unavailable here: {e}");
                return;
            }
        };
        super::super::stripe::tests::check_sends_at_once(2, |jobs| ring.send(jobs));
    }
}
