//! `ampccl-run -n N [--] PROGRAM [ARGS...]`: starts `N` ranks of `PROGRAM` on this host, for
//! users without a launcher.
//!
//! * **Rendezvous.** The launcher makes a unique id (`UniqueId::generate`: its root thread runs
//!   in the launcher, on `AMPCCL_BOOTSTRAP_ADDR` or loopback) and gives every rank
//!   `AMPCCL_UNIQUE_ID`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE` (and removes
//!   `AMPCCL_RANK`, `AMPCCL_WORLD_SIZE`, `AMPCCL_LOCAL_RANK`, `AMPCCL_RENDEZVOUS` it would
//!   otherwise pass on), so `Communicator::from_env()` joins. The id serves one rendezvous:
//!   a program makes further communicators with `split`.
//! * **Output.** Each rank's stdout and stderr go through pipes; every line comes out on the
//!   launcher's stdout or stderr prefixed with `[rank] ` (one write per line, so lines of
//!   different ranks never interleave within a line). Ranks read stdin from `/dev/null`.
//! * **Signals.** Each rank runs in a process group of its own (a terminal's Ctrl-C reaches
//!   the launcher only) and dies with the launcher (`PR_SET_PDEATHSIG`). SIGINT, SIGTERM and
//!   SIGHUP received by the launcher are forwarded to every rank's group.
//! * **Failure.** When a rank exits non-zero or by a signal, the others get SIGTERM and, 3 s
//!   later, SIGKILL; the launcher exits with that rank's status (128 + signal for a signal).
//!   Otherwise it waits for every rank and exits 0.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use ampccl::UniqueId;

const USAGE: &str = "usage: ampccl-run -n N [--] PROGRAM [ARGS...]\n\
  Starts N ranks of PROGRAM on this host with AMPCCL_UNIQUE_ID, RANK, WORLD_SIZE, LOCAL_RANK\n\
  and LOCAL_WORLD_SIZE set (Communicator::from_env() joins), prefixes their output with\n\
  [rank], forwards SIGINT/SIGTERM/SIGHUP, and stops the job when a rank fails.";
/// How long ranks get between SIGTERM and SIGKILL once one failed.
const GRACE: Duration = Duration::from_secs(3);
/// The last signal received, 0 once forwarded.
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    PENDING.store(sig, Ordering::SeqCst);
}

fn parse(args: &[String]) -> Result<(usize, &[String]), String> {
    let mut i = 0;
    let mut n = None;
    while i < args.len() {
        let a = args[i].as_str();
        match a {
            "-h" | "--help" => return Err(String::new()),
            "-n" | "-np" | "--np" => {
                let v = args.get(i + 1).ok_or("-n needs a number")?;
                n = Some(
                    v.parse::<usize>()
                        .map_err(|_| format!("-n {v}: not a number"))?,
                );
                i += 2;
            }
            "--" => {
                i += 1;
                break;
            }
            _ if a.starts_with('-') => return Err(format!("unknown option {a}")),
            _ => break,
        }
    }
    let n = n.ok_or("-n N is required")?;
    if n == 0 || n > 4096 {
        return Err(format!("-n {n}: expected 1 to 4096 ranks"));
    }
    if i >= args.len() {
        return Err("no program given".into());
    }
    Ok((n, &args[i..]))
}

/// Copies `from` line by line to stdout or stderr with the `[rank] ` prefix.
fn relay(rank: usize, from: impl Read, to_stderr: bool) {
    let mut r = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        let mut out = format!("[{rank}] ").into_bytes();
        out.extend_from_slice(&line);
        // One write per line: whole lines even when ranks print at once.
        let _ = if to_stderr {
            std::io::stderr().lock().write_all(&out)
        } else {
            std::io::stdout().lock().write_all(&out)
        };
    }
}

/// Signals rank `child`'s process group.
fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) with a negative pid signals that process group; the group is the child's
    // own (it was started with `process_group(0)`), and sending a signal touches no memory.
    unsafe { libc::kill(-(child.id() as libc::pid_t), sig) };
}

/// The launcher's exit code for a rank's status.
fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => 1,
    }
}

fn spawn(rank: usize, n: usize, id: &UniqueId, prog: &[String]) -> std::io::Result<Child> {
    let mut cmd = Command::new(&prog[0]);
    cmd.args(&prog[1..])
        .env("AMPCCL_UNIQUE_ID", id.to_hex())
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", n.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("LOCAL_WORLD_SIZE", n.to_string())
        .env_remove("AMPCCL_RANK")
        .env_remove("AMPCCL_WORLD_SIZE")
        .env_remove("AMPCCL_LOCAL_RANK")
        .env_remove("AMPCCL_RENDEZVOUS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2),
    // which is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    };
    cmd.spawn()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (n, prog) = match parse(&args) {
        Ok(p) => p,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("ampccl-run: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(if e.is_empty() { 0 } else { 2 });
        }
    };
    let id = match UniqueId::generate() {
        Ok(id) => id,
        Err(e) => {
            eprintln!("ampccl-run: making the unique id: {e}");
            return ExitCode::from(1);
        }
    };
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `on_signal` is an `extern "C"` handler that only stores to an atomic, which
        // is async-signal-safe.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let mut children: Vec<Option<Child>> = Vec::with_capacity(n);
    let mut relays = Vec::new();
    for rank in 0..n {
        match spawn(rank, n, &id, prog) {
            Ok(mut c) => {
                let (out, err) = (c.stdout.take(), c.stderr.take());
                relays.extend(out.map(|o| std::thread::spawn(move || relay(rank, o, false))));
                relays.extend(err.map(|e| std::thread::spawn(move || relay(rank, e, true))));
                children.push(Some(c));
            }
            Err(e) => {
                eprintln!("ampccl-run: starting rank {rank} ({}): {e}", prog[0]);
                children
                    .iter()
                    .flatten()
                    .for_each(|c| signal(c, libc::SIGKILL));
                return ExitCode::from(127);
            }
        }
    }
    let mut failed: Option<(usize, ExitStatus)> = None;
    let mut kill_at: Option<Instant> = None;
    let mut stop = false;
    while children.iter().any(Option::is_some) {
        let sig = PENDING.swap(0, Ordering::SeqCst);
        if sig != 0 {
            children.iter().flatten().for_each(|c| signal(c, sig));
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            children
                .iter()
                .flatten()
                .for_each(|c| signal(c, libc::SIGKILL));
            kill_at = None;
        }
        for (rank, slot) in children.iter_mut().enumerate() {
            let Some(c) = slot else { continue };
            let status = match c.try_wait() {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("ampccl-run: waiting for rank {rank}: {e}");
                    ExitStatus::from_raw(1 << 8)
                }
            };
            *slot = None;
            if !status.success() && failed.is_none() {
                eprintln!("ampccl-run: rank {rank} failed ({status}); stopping the other ranks");
                failed = Some((rank, status));
                kill_at = Some(Instant::now() + GRACE);
                stop = true;
            }
        }
        if std::mem::take(&mut stop) {
            children
                .iter()
                .flatten()
                .for_each(|c| signal(c, libc::SIGTERM));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for r in relays {
        let _ = r.join();
    }
    match failed {
        Some((_, status)) => ExitCode::from(code_of(status).max(1)),
        None => ExitCode::SUCCESS,
    }
}
