//! How frames leave: whole, through [`SendPath`] (`sendmsg`, or io_uring's zero-copy sends for
//! large payloads, see [`super::uring`]); and over several connections per peer
//! (`AMPCCL_NSOCKS`), for links one TCP stream cannot fill.
//!
//! Connection 0 carries every frame; connections 1.. carry only the stripes of large one-sided
//! writes and the immediates that close them. A write of at least [`STRIPE_MIN`] bytes per
//! stripe is cut into up to `nsocks` contiguous stripes, each a write frame on its own
//! connection, all sent at once from the calling thread: non-blocking `sendmsg` round robin,
//! `poll` for room when every socket is full ([`send_parallel`]). The receiver's threads (one
//! per connection) take the stripes in parallel, each straight into its part of the memory the
//! clear-to-send named.
//!
//! One connection delivers in order, several do not: so the immediate that completes a
//! transfer goes on every connection that carried a stripe of it since the last immediate of
//! that slot, each copy saying how many copies there are (the segment count, `b` of the
//! immediate frame). The receiver publishes the immediate when the last copy arrives, by
//! which time every stripe has (each copy follows its connection's stripes).

use std::io::IoSlice;
use std::os::fd::RawFd;

use ampccl_runtime::param::{Param, Unit};

use crate::protocol::stripe_count;

/// Connections per pair of ranks (rank 0's value holds for the whole communicator).
pub static NSOCKS: Param = Param::new(
    "NSOCKS",
    4,
    (1, 16),
    Unit::Count,
    "TCP connections per pair of ranks; large writes are striped over them",
);

/// Smallest stripe of a striped write.
pub static STRIPE_MIN: Param = Param::new(
    "TCP_STRIPE_MIN",
    256 << 10,
    (4 << 10, 1 << 30),
    Unit::Bytes,
    "smallest stripe when a TCP write is cut over several connections (AMPCCL_NSOCKS > 1)",
);

/// How `len` bytes are cut over at most `nsocks` connections with stripes of at least
/// `min` bytes ([`stripe_count`]): `(offset, len)` per stripe, in connection order.
pub fn stripes(len: usize, nsocks: usize, min: usize) -> Vec<(usize, usize)> {
    let n = stripe_count(len, nsocks, min);
    let base = len / n;
    let extra = len % n;
    let mut out = Vec::with_capacity(n);
    let mut off = 0;
    for i in 0..n {
        let l = base + usize::from(i < extra);
        out.push((off, l));
        off += l;
    }
    out
}

/// One connection's share of a parallel send: its socket and its buffers (deferred frames,
/// header, payload), `first` the first buffer not sent whole yet.
pub struct Job<'a> {
    pub fd: RawFd,
    pub bufs: [IoSlice<'a>; 3],
    first: usize,
}

impl<'a> Job<'a> {
    pub fn new(fd: RawFd, bufs: [IoSlice<'a>; 3]) -> Job<'a> {
        let mut j = Job { fd, bufs, first: 0 };
        j.advance(0);
        j
    }

    /// Whether every buffer is sent.
    pub fn done(&self) -> bool {
        self.first == self.bufs.len()
    }

    /// The buffers (or their parts) not sent yet.
    pub fn rest(&self) -> &[IoSlice<'a>] {
        &self.bufs[self.first..]
    }

    /// Bytes not sent yet.
    #[cfg(feature = "io-uring")]
    fn len(&self) -> usize {
        self.rest().iter().map(|b| b.len()).sum()
    }

    /// Marks `n` more bytes sent (empty buffers count as sent).
    pub fn advance(&mut self, n: usize) {
        let total = self.bufs.len();
        let mut rest: &mut [IoSlice<'a>] = &mut self.bufs[self.first..];
        IoSlice::advance_slices(&mut rest, n);
        self.first = total - rest.len();
    }
}

/// `AMPCCL_TCP_IO`: how a device's frames leave.
pub enum SendPath {
    /// `sendmsg` from the calling thread.
    Sendmsg,
    /// Payloads of at least [`super::uring::ZC_MIN`] bytes through io_uring's zero-copy
    /// sends; smaller ones as `Sendmsg`.
    #[cfg(feature = "io-uring")]
    Uring(Box<super::uring::Ring>),
}

impl SendPath {
    /// The path `AMPCCL_TCP_IO` asks for (`epoll`, the default: `sendmsg` and one receiving
    /// thread in `epoll_wait`; `uring`: zero-copy sends through io_uring, where the build has
    /// the `io-uring` feature and the kernel allows it, else `sendmsg` with a warning).
    pub fn from_env() -> ampccl_runtime::Result<SendPath> {
        Self::from_value(&std::env::var("AMPCCL_TCP_IO").unwrap_or_default())
    }

    /// [`SendPath::from_env`] for the value `v`.
    fn from_value(v: &str) -> ampccl_runtime::Result<SendPath> {
        match v.trim() {
            "" | "epoll" => Ok(SendPath::Sendmsg),
            "uring" => Ok(Self::uring()),
            other => Err(ampccl_runtime::Error::InvalidArgument(format!(
                "AMPCCL_TCP_IO={other:?}: expected epoll or uring"
            ))),
        }
    }

    #[cfg(feature = "io-uring")]
    fn uring() -> SendPath {
        match super::uring::Ring::new() {
            Ok(r) => SendPath::Uring(Box::new(r)),
            Err(e) => {
                tracing::warn!("AMPCCL_TCP_IO=uring: io_uring unavailable ({e}); using sendmsg");
                SendPath::Sendmsg
            }
        }
    }

    #[cfg(not(feature = "io-uring"))]
    fn uring() -> SendPath {
        tracing::warn!("AMPCCL_TCP_IO=uring: built without the io-uring feature; using sendmsg");
        SendPath::Sendmsg
    }

    /// The path's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            SendPath::Sendmsg => "sendmsg",
            #[cfg(feature = "io-uring")]
            SendPath::Uring(_) => "io_uring zero-copy",
        }
    }

    /// Sends every job whole (several at once); returns when every byte is sent and the
    /// memory is the caller's again.
    pub fn send(&self, jobs: &mut [Job<'_>]) -> std::io::Result<()> {
        #[cfg(feature = "io-uring")]
        if let SendPath::Uring(ring) = self
            && jobs.iter().map(Job::len).sum::<usize>() >= super::uring::ZC_MIN
        {
            return ring.send(jobs);
        }
        match jobs {
            [one] => send_blocking(one),
            _ => send_parallel(jobs),
        }
    }
}

/// Sends `job` whole on its blocking socket, in as few `sendmsg` calls as the socket allows.
pub fn send_blocking(job: &mut Job<'_>) -> std::io::Result<()> {
    while !job.done() {
        let n = sendmsg(job.fd, job.rest(), 0)?.unwrap_or(0);
        job.advance(n);
    }
    Ok(())
}

/// Sends every job whole, all at once from this thread: each `sendmsg` takes what its socket
/// has room for (`MSG_DONTWAIT`); when no socket took anything, waits in `poll` until one has
/// room. The first error ends it (the connection is lost).
fn send_parallel(jobs: &mut [Job<'_>]) -> std::io::Result<()> {
    loop {
        let mut moved = false;
        for job in jobs.iter_mut().filter(|j| !j.done()) {
            let rest = &job.bufs[job.first..];
            if let Some(n) = sendmsg(job.fd, rest, libc::MSG_DONTWAIT)? {
                job.advance(n);
                moved = true;
            }
        }
        let mut waiting: Vec<libc::pollfd> = jobs
            .iter()
            .filter(|j| !j.done())
            .map(|j| libc::pollfd {
                fd: j.fd,
                events: libc::POLLOUT,
                revents: 0,
            })
            .collect();
        if waiting.is_empty() {
            return Ok(());
        }
        if !moved {
            // SAFETY: `waiting` holds `waiting.len()` valid pollfds for the call.
            let r = unsafe { libc::poll(waiting.as_mut_ptr(), waiting.len() as _, 1000) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// One `sendmsg` of `bufs` on `fd` with `flags` (and `MSG_NOSIGNAL`: a closed peer is an
/// error, not a `SIGPIPE` that kills a C host program): `Some(bytes)` sent, `None` when a
/// non-blocking socket had no room.
pub fn sendmsg(fd: RawFd, bufs: &[IoSlice<'_>], flags: i32) -> std::io::Result<Option<usize>> {
    loop {
        // SAFETY: `msghdr` is plain data, all zeros an empty message without an address.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len().min(libc::UIO_MAXIOV as usize) as _;
        // SAFETY: `msg` names `msg_iovlen` live `IoSlice`s, which are ABI-compatible with
        // `iovec`; `sendmsg` only reads them and the bytes they point to.
        let n = unsafe { libc::sendmsg(fd, &msg, flags | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(Some(n as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => continue,
            std::io::ErrorKind::WouldBlock => return Ok(None),
            _ => return Err(e),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Read;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    #[test]
    fn the_send_path_is_epoll_or_uring() {
        assert_eq!(SendPath::from_value("").unwrap().name(), "sendmsg");
        assert_eq!(SendPath::from_value(" epoll ").unwrap().name(), "sendmsg");
        assert!(SendPath::from_value("uring").is_ok());
        let e = SendPath::from_value("kqueue").err().unwrap().to_string();
        assert!(
            e.contains("AMPCCL_TCP_IO") && e.contains("epoll or uring"),
            "{e}"
        );
    }

    #[test]
    fn stripes_cover_the_message_in_order() {
        assert_eq!(stripes(10, 4, 100), vec![(0, 10)]);
        assert_eq!(stripes(0, 4, 100), vec![(0, 0)]);
        assert_eq!(
            stripes(1000, 4, 300),
            vec![(0, 334), (334, 333), (667, 333)]
        );
        assert_eq!(stripes(1 << 20, 4, 1 << 10).len(), 4);
        for (len, n, min) in [(12_345, 3, 1000), (7, 7, 1), (1 << 20, 16, 4096)] {
            let s = stripes(len, n, min);
            assert!(s.len() <= n && s.iter().all(|&(_, l)| l >= min.min(len)));
            assert_eq!(s.iter().map(|&(_, l)| l).sum::<usize>(), len);
            assert!(s.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0));
        }
    }

    /// Sends through `send`, at once, more than each of `n` sockets' buffers holds; checks
    /// that every byte arrives, in order, on its socket. Shared by the send paths' tests.
    pub(crate) fn check_sends_at_once(
        n: u8,
        send: impl FnOnce(&mut [Job<'_>]) -> std::io::Result<()>,
    ) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx: Vec<TcpStream> = (0..n)
            .map(|_| TcpStream::connect(l.local_addr().unwrap()).unwrap())
            .collect();
        let rx: Vec<TcpStream> = (0..n).map(|_| l.accept().unwrap().0).collect();
        let payloads: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                (0..4_000_000u32)
                    .map(|k| (k as u8).wrapping_mul(3) ^ i)
                    .collect()
            })
            .collect();
        let readers: Vec<_> = rx
            .into_iter()
            .map(|mut s| {
                std::thread::spawn(move || {
                    let mut got = Vec::new();
                    s.read_to_end(&mut got).unwrap();
                    got
                })
            })
            .collect();
        let heads: Vec<[u8; 4]> = (0..n).map(|i| [i; 4]).collect();
        let mut jobs: Vec<Job> = tx
            .iter()
            .zip(&heads)
            .zip(&payloads)
            .map(|((s, h), p)| {
                Job::new(
                    s.as_raw_fd(),
                    [IoSlice::new(&[]), IoSlice::new(h), IoSlice::new(p)],
                )
            })
            .collect();
        send(&mut jobs).unwrap();
        drop(jobs);
        drop(tx);
        for (i, r) in readers.into_iter().enumerate() {
            let got = r.join().unwrap();
            assert_eq!(got[..4], heads[i]);
            assert!(got[4..] == payloads[i][..], "socket {i}");
        }
    }

    #[test]
    fn parallel_sends_deliver_every_job_whole() {
        check_sends_at_once(3, send_parallel);
    }
}
