//! `Communicator::from_env` under real launchers: `ampccl-run` (this crate's binary), Intel
//! MPI's `mpirun` (hydra, PMI-1 on `PMI_FD`) and torchrun (its agent's TCPStore holds
//! `MASTER_PORT`). Each test starts this test binary as the ranks, running only
//! `worker_entry` with `AMPCCL_LAUNCH_WORKER` naming what to do; the launcher alone sets the
//! rendezvous environment.
//!
//! Intel MPI and torch come from `benches/peers/install.sh` (under `$PEERS_HOME`, default
//! `~/.cache/ampccl-peers`); `.ci/run` installs them. Without them the tests print
//! `SKIPPED: ...` and pass, except under `CI`, where they fail.

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use ampccl::{Communicator, ReduceOp};

const WORKER_VAR: &str = "AMPCCL_LAUNCH_WORKER";

/// The ranks' side: joins with `from_env`, checks an allreduce, prints a line the test checks.
#[test]
fn worker_entry() {
    let Ok(what) = std::env::var(WORKER_VAR) else {
        return;
    };
    let code = match what.as_str() {
        "allreduce" => match allreduce() {
            Ok(line) => {
                // After libtest's "test worker_entry ... ", on a line of its own.
                println!("\n{line}");
                0
            }
            Err(e) => {
                eprintln!("worker failed: {e}");
                1
            }
        },
        // Rank 1 fails before joining; the others would wait for it (at most a minute).
        "fail" => {
            if std::env::var("RANK").as_deref() == Ok("1") {
                eprintln!("rank 1 fails on purpose");
                7
            } else {
                std::thread::sleep(Duration::from_secs(60));
                0
            }
        }
        "sleep" => {
            println!("ready");
            std::thread::sleep(Duration::from_secs(60));
            0
        }
        w => {
            eprintln!("unknown worker {w:?}");
            1
        }
    };
    std::process::exit(code);
}

fn allreduce() -> Result<String, String> {
    let comm = Communicator::from_env().map_err(|e| format!("from_env: {e}"))?;
    let (rank, world) = (comm.rank(), comm.world());
    let send = vec![rank as f32 + 1.0; 1000];
    let mut recv = vec![0.0f32; 1000];
    comm.all_reduce(&send, &mut recv, ReduceOp::Sum)
        .map_err(|e| format!("all_reduce: {e}"))?;
    let want = (world * (world + 1) / 2) as f32;
    if recv.iter().any(|&x| x != want) {
        return Err(format!("allreduce gave {}, expected {want}", recv[0]));
    }
    let local = comm.local_rank();
    comm.destroy().map_err(|e| format!("destroy: {e}"))?;
    Ok(format!("launch-ok rank={rank} world={world} local={local}"))
}

/// This test binary, run as ranks: `worker_entry` only, with `what`.
fn worker_args() -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    vec![
        exe.to_string_lossy().into_owned(),
        "worker_entry".into(),
        "--exact".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ]
}

fn prepare(cmd: &mut Command, what: &str) {
    for v in ampccl_transport::bootstrap::RENDEZVOUS_VARS {
        cmd.env_remove(v);
    }
    cmd.env(WORKER_VAR, what)
        .env("AMPCCL_LOG", "info")
        .env("AMPCCL_TIMEOUT_S", "60")
        .stdin(Stdio::null());
}

fn show(o: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Both ranks printed their line (after `prefix`), and the logs name `source`.
fn check_ok(o: &Output, prefix: &dyn Fn(usize) -> String, source: &str) {
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", show(o));
    for r in 0..2 {
        let line = format!("{}launch-ok rank={r} world=2 local={r}", prefix(r));
        assert!(
            out.lines().any(|l| l == line),
            "no {line:?} in\n{}",
            show(o)
        );
    }
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(source),
        "the log does not name {source:?}:\n{}",
        show(o)
    );
}

fn ampccl_run() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ampccl-run"))
}

#[test]
fn ampccl_run_starts_ranks_and_prefixes_their_output() {
    let mut cmd = ampccl_run();
    cmd.args(["-n", "2"]).args(worker_args());
    prepare(&mut cmd, "allreduce");
    let o = cmd.output().unwrap();
    check_ok(
        &o,
        &|r| format!("[{r}] "),
        "the unique id in AMPCCL_UNIQUE_ID",
    );
}

#[test]
fn ampccl_run_stops_the_job_with_the_failing_ranks_status() {
    let mut cmd = ampccl_run();
    cmd.args(["-n", "3"]).args(worker_args());
    prepare(&mut cmd, "fail");
    let t = Instant::now();
    let o = cmd.output().unwrap();
    assert_eq!(o.status.code(), Some(7), "{}", show(&o));
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "the other ranks were not stopped"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("[1] rank 1 fails on purpose"), "{}", show(&o));
    assert!(err.contains("ampccl-run: rank 1 failed"), "{}", show(&o));
}

#[test]
fn ampccl_run_forwards_sigterm_and_rejects_bad_usage() {
    let mut cmd = ampccl_run();
    cmd.args(["-n", "2"]).args(worker_args());
    prepare(&mut cmd, "sleep");
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut ready = 0;
    let mut line = String::new();
    while ready < 2 {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "ranks ended"
        );
        ready += usize::from(line.ends_with("ready\n"));
    }
    let t = Instant::now();
    // SAFETY: kill(2) touches no memory; the pid is the launcher child we started, not yet
    // waited for, so it cannot have been reused.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15));
    assert!(t.elapsed() < Duration::from_secs(10));
    for bad in [&["-n", "0", "true"][..], &["true"], &["-n", "2"], &["-x"]] {
        let o = ampccl_run().args(bad).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad:?}");
        assert!(String::from_utf8_lossy(&o.stderr).contains("usage: ampccl-run"));
    }
}

/// A peer installation under `$PEERS_HOME`, or `None` (skipped; a failure under `CI`).
fn peer(rel: &str) -> Option<PathBuf> {
    let home = std::env::var_os("PEERS_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ampccl-peers")
        });
    let p = home.join(rel);
    if p.exists() {
        return Some(p);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{} is missing: run benches/peers/install.sh (.ci/run does)",
        p.display()
    );
    println!(
        "SKIPPED: {} is missing (benches/peers/install.sh installs it)",
        p.display()
    );
    None
}

#[test]
fn intel_mpi_mpirun_starts_ranks_through_pmi() {
    let Some(root) = peer("impi") else { return };
    let bin = root.join("bin");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new(bin.join("mpirun"));
    cmd.args(["-n", "2"]).args(worker_args());
    prepare(&mut cmd, "allreduce");
    cmd.env("I_MPI_ROOT", &root)
        .env("PATH", path)
        .env("LD_LIBRARY_PATH", root.join("lib"));
    let o = cmd.output().unwrap();
    check_ok(&o, &|_| String::new(), "PMI-1 on PMI_FD");
}

/// Open MPI's mpirun offers no rendezvous ampccl speaks: without MASTER_ADDR every rank fails
/// saying what to pass; with `-x MASTER_ADDR -x MASTER_PORT` the ranks (numbered by
/// `OMPI_COMM_WORLD_RANK`) join.
#[test]
fn open_mpi_mpirun_says_what_to_set_and_works_with_master_addr() {
    let Some(root) = peer("ompi") else { return };
    let mpirun = |extra: &[&str]| {
        let mut cmd = Command::new(root.join("bin/mpirun"));
        cmd.args(["--allow-run-as-root", "--oversubscribe", "-n", "2"])
            .args(extra)
            .args(worker_args());
        prepare(&mut cmd, "allreduce");
        cmd.output().unwrap()
    };
    let o = mpirun(&[]);
    assert!(!o.status.success(), "{}", show(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("Open MPI") && err.contains("-x MASTER_ADDR"),
        "{}",
        show(&o)
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let o = mpirun(&[
        "-x",
        "MASTER_ADDR=127.0.0.1",
        "-x",
        &format!("MASTER_PORT={port}"),
    ]);
    check_ok(&o, &|_| String::new(), "MASTER_ADDR:MASTER_PORT 127.0.0.1");
}

#[test]
fn torchrun_starts_ranks_through_its_tcpstore() {
    let Some(torchrun) = peer("torch/bin/torchrun") else {
        return;
    };
    let mut cmd = Command::new(torchrun);
    cmd.args(["--nproc_per_node=2", "--no-python"])
        .args(worker_args());
    prepare(&mut cmd, "allreduce");
    let o = cmd.output().unwrap();
    check_ok(&o, &|_| String::new(), "torchrun's TCPStore");
}

/// The TCPStore client against PyTorch's own store, both of its server backends (libuv, the
/// default since 2.4, and the older thread-based one): every query the client has. PyTorch's
/// client puts `/` in front of each key, so the raw keys here carry it.
#[test]
fn the_tcpstore_client_speaks_with_pytorchs_store() {
    use ampccl_transport::bootstrap::tcpstore::StoreClient;
    let Some(python) = peer("torch/bin/python") else {
        return;
    };
    const SERVER: &str = r#"
import datetime, sys
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30),
             wait_for_workers=False, use_libuv=sys.argv[1] == "1")
print("port", s.port, flush=True)
s.wait(["from-rust"])
assert s.get("from-rust") == b"hello \x00\xff", s.get("from-rust")
s.set("from-python", b"world")
s.wait(["done"])
print("python-ok", s.add("counter", 0), flush=True)
"#;
    for libuv in ["1", "0"] {
        let mut py = Command::new(&python)
            .args(["-c", SERVER, libuv])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(py.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        let port: u16 = line
            .trim()
            .strip_prefix("port ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("libuv={libuv}: no port in {line:?}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut c = StoreClient::connect("127.0.0.1", port, deadline).unwrap();
        c.ping(deadline).unwrap();
        assert!(!c.check(&["/from-python"], deadline).unwrap());
        // A missing key: PyTorch 2.15's libuv store closes the connection (clients wait
        // first), older stores answer an empty value; either way nothing hangs.
        match c.get("/missing", deadline) {
            Ok(v) => assert_eq!(v, b"", "libuv={libuv}"),
            Err(_) => c = StoreClient::connect("127.0.0.1", port, deadline).unwrap(),
        }
        c.set("/from-rust", b"hello \x00\xff", deadline).unwrap();
        c.wait(&["/from-python"], deadline).unwrap();
        assert_eq!(c.get("/from-python", deadline).unwrap(), b"world");
        assert!(c.check(&["/from-python", "/from-rust"], deadline).unwrap());
        assert_eq!(c.add("/counter", 5, deadline).unwrap(), 5);
        assert_eq!(c.add("/counter", -2, deadline).unwrap(), 3);
        c.set("/done", b"", deadline).unwrap();
        line.clear();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line.trim(), "python-ok 3", "libuv={libuv}");
        assert!(py.wait().unwrap().success(), "libuv={libuv}");
    }
}
