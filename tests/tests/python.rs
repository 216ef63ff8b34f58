//! The Python package (`ffi/python`) end to end: its numpy API on 2 and 4 ranks, and its
//! torch.distributed backend under torchrun (every operation, DDP against a single-process
//! reference, a comm hook, `new_group`, asynchronous works, `TORCH_DISTRIBUTED_DEBUG=DETAIL`),
//! on one host and across 2 emulated hosts. The Python scripts in `ffi/python/tests` check
//! the results and print an `-ok` line per rank, which the tests look for.
//!
//! The wheel: maturin builds it (the `dev` profile: quick to build, ample for these tests) and pip
//! unpacks it with `--target` into a directory put on `PYTHONPATH` (its metadata carries the
//! entry point through which torch finds the backend), for each test.
//! Python, numpy, torch, torchrun and maturin come from the venv of
//! `benches/peers/install.sh --launchers`; without it a test prints `SKIPPED: ...` and passes,
//! except under `CI`.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ampccl::UniqueId;
use ampccl_tests::Hosts;
use ampccl_tests::hosts::in_ci;
use ampccl_transport::bootstrap::RENDEZVOUS_VARS;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn script(name: &str) -> PathBuf {
    repo().join("ffi/python/tests").join(name)
}

/// The venv's `bin` directory, if installed (else SKIPPED, or a failure under CI).
fn venv_bin() -> Option<PathBuf> {
    let home = std::env::var_os("PEERS_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ampccl-peers")
        });
    let bin = home.join("torch/bin");
    let missing: Vec<_> = ["python", "torchrun", "maturin"]
        .iter()
        .filter(|t| !bin.join(t).exists())
        .collect();
    if missing.is_empty() {
        return Some(bin);
    }
    let why = format!(
        "{missing:?} missing in {}: run benches/peers/install.sh --launchers",
        bin.display()
    );
    assert!(!in_ci(), "{why}");
    println!("SKIPPED: {why}");
    None
}

/// Runs `cmd` to its end, panicking with its output unless it succeeds.
fn run_ok(cmd: &mut Command, what: &str) {
    let o = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(
        o.status.success(),
        "{what}: {}\n--- stdout\n{}--- stderr\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Builds the wheel and unpacks it into a directory of test `name`'s, which it returns (for
/// `PYTHONPATH`). The builds of tests running at once take turns (maturin stages the library
/// at one path of the target directory): the first compiles, the others find it done.
fn install_wheel(bin: &Path, name: &str) -> PathBuf {
    let top = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("python");
    let dir = top.join(name);
    let (wheels, site) = (dir.join("wheels"), dir.join("site"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let lock = File::create(top.join("build.lock")).unwrap();
    // SAFETY: flock(2) on a descriptor `lock` owns; closing it (at the end of this function)
    // releases the lock.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    run_ok(
        Command::new(bin.join("maturin"))
            .args(["build", "--quiet", "-i"])
            .arg(bin.join("python"))
            .arg("-m")
            .arg(repo().join("ffi/python/Cargo.toml"))
            .arg("-o")
            .arg(&wheels),
        "maturin build",
    );
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .expect("maturin built no wheel");
    run_ok(
        Command::new(bin.join("pip"))
            .args(["install", "--quiet", "--no-deps", "--target"])
            .arg(&site)
            .arg(&wheel),
        "pip install --target",
    );
    site
}

/// `cmd` with the wheel on `PYTHONPATH`, a clean launch environment and piped output.
fn python_env(mut cmd: Command, site: &Path) -> Command {
    // The rendezvous variables of the test's own environment, and torch's debug mode, which
    // the tests set where they want it.
    for v in RENDEZVOUS_VARS.iter().chain(&["TORCH_DISTRIBUTED_DEBUG"]) {
        cmd.env_remove(v);
    }
    cmd.env("PYTHONPATH", site)
        .env("AMPCCL_TIMEOUT_S", "60")
        .env("OMP_NUM_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Waits for `children` until `limit`, killing them past it; returns each one's success and
/// output (stdout, then stderr).
fn collect(children: Vec<Child>, limit: Duration) -> Vec<(bool, String)> {
    let deadline = Instant::now() + limit;
    let readers: Vec<_> = children
        .into_iter()
        .map(|mut c| {
            let (mut out, mut err) = (c.stdout.take().unwrap(), c.stderr.take().unwrap());
            let o = std::thread::spawn(move || {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s);
                s
            });
            let e = std::thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                s
            });
            (c, o, e)
        })
        .collect();
    readers
        .into_iter()
        .map(|(mut c, o, e)| {
            let ok = loop {
                if let Some(s) = c.try_wait().unwrap() {
                    break s.success();
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    break false;
                }
                std::thread::sleep(Duration::from_millis(50));
            };
            (ok, o.join().unwrap() + &e.join().unwrap())
        })
        .collect()
}

/// Every process succeeded and the output holds `line(r)` for each rank `r`.
fn check(results: &[(bool, String)], ranks: usize, line: impl Fn(usize) -> String) {
    let all: String = results.iter().map(|(_, s)| s.as_str()).collect();
    let report = || {
        results
            .iter()
            .enumerate()
            .map(|(i, (ok, s))| format!("--- process {i}: success {ok}\n{s}\n"))
            .collect::<String>()
    };
    assert!(results.iter().all(|(ok, _)| *ok), "{}", report());
    for r in 0..ranks {
        assert!(all.contains(&line(r)), "no {:?} in\n{}", line(r), report());
    }
}

/// The numpy script on `world` ranks joining through a unique id (as `ampccl-run` starts
/// them: `AMPCCL_UNIQUE_ID`, `RANK`, `WORLD_SIZE`).
fn numpy_on(world: usize) {
    let Some(bin) = venv_bin() else {
        return;
    };
    let site = install_wheel(&bin, &format!("numpy-{world}"));
    let id = UniqueId::generate().unwrap().to_hex();
    let children = (0..world)
        .map(|r| {
            python_env(Command::new(bin.join("python")), &site)
                .arg(script("numpy_ops.py"))
                .env("AMPCCL_UNIQUE_ID", &id)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .spawn()
                .unwrap()
        })
        .collect();
    let results = collect(children, Duration::from_secs(240));
    check(&results, world, |r| {
        format!("numpy-ok rank={r} world={world}")
    });
}

#[test]
fn numpy_api_on_2_ranks() {
    numpy_on(2);
}

#[test]
fn numpy_api_on_4_ranks() {
    numpy_on(4);
}

/// The torch script under one torchrun of `n` ranks, with `debug` as
/// `TORCH_DISTRIBUTED_DEBUG`.
fn torchrun_on(n: usize, debug: &str) {
    let Some(bin) = venv_bin() else {
        return;
    };
    let site = install_wheel(&bin, &format!("torchrun-{n}"));
    let child = python_env(Command::new(bin.join("torchrun")), &site)
        .args(["--standalone", &format!("--nproc-per-node={n}")])
        .arg(script("torch_backend.py"))
        .env("TORCH_DISTRIBUTED_DEBUG", debug)
        .spawn()
        .unwrap();
    let results = collect(vec![child], Duration::from_secs(300));
    check(&results, n, |r| {
        format!("torch-ok rank={r} world={n} debug={debug}")
    });
}

#[test]
fn torch_backend_under_torchrun_2_ranks() {
    torchrun_on(2, "OFF");
}

#[test]
fn torch_backend_under_torchrun_3_ranks_detail() {
    torchrun_on(3, "DETAIL");
}

#[test]
fn torch_backend_across_two_hosts() {
    let Some(bin) = venv_bin() else {
        return;
    };
    let Some(hosts) = Hosts::new_or_skip(2) else {
        return;
    };
    let site = install_wheel(&bin, "hosts");
    let children = (0..2)
        .map(|node| {
            python_env(hosts.command(node, bin.join("torchrun")), &site)
                .args([
                    "--nnodes=2",
                    "--nproc-per-node=1",
                    &format!("--node-rank={node}"),
                    &format!("--master-addr={}", hosts.addr(0)),
                    "--master-port=29500",
                ])
                .arg(script("torch_backend.py"))
                .env("TORCH_DISTRIBUTED_DEBUG", "OFF")
                .spawn()
                .unwrap()
        })
        .collect();
    let results = collect(children, Duration::from_secs(300));
    check(&results, 2, |r| {
        format!("torch-ok rank={r} world=2 debug=OFF")
    });
}
