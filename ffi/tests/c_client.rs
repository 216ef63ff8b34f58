//! Drives the C and Python clients of `libampccl.so`: compiles `tests/c/collectives.c` with
//! `cc` against the checked-in header and the library cargo built next to this test binary,
//! then runs it (and `tests/python/client.py` through ctypes) as several processes.
//!
//! The library is the `cdylib` of this crate, built by [`lib_dir`] (cargo builds no `cdylib`
//! for integration tests). The clients turn the hex id back into an
//! `ampcclUniqueId` with `ampcclUniqueIdFromString` and print it back with
//! `ampcclUniqueIdToString`, so both extensions are covered.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/cdylib.rs"]
mod cdylib;

/// Directory holding a fresh `libampccl.so` (built once per test process).
fn lib_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| cdylib::build("ampccl-ffi", "libampccl.so", crate_dir()))
        .clone()
}

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A fresh unique id in hex (its rendezvous root runs in this process).
fn unique_id_hex() -> String {
    ampccl_native::UniqueId::generate()
        .expect("unique id")
        .to_hex()
}

/// Runs `cmd` as `world` ranks and fails unless every one exits with 0.
/// Runs `cmd` as `world` ranks (an empty value in `extra_env` removes the variable) and returns
/// each rank's standard error.
fn launch(world: usize, cmd: &[&str], extra_env: &[(&str, String)]) -> Vec<String> {
    let hex = unique_id_hex();
    let mut children: Vec<_> = (0..world)
        .map(|r| {
            let mut c = Command::new(cmd[0]);
            c.args(&cmd[1..])
                .env("AMPCCL_UNIQUE_ID", &hex)
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("AMPCCL_TIMEOUT_S", "60")
                .env("AMPCCL_LOG", "error")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in extra_env {
                if v.is_empty() {
                    c.env_remove(k);
                } else {
                    c.env(k, v);
                }
            }
            c.spawn().expect("spawn a rank")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut failed = Vec::new();
    for (r, child) in children.iter_mut().enumerate() {
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                if !st.success() {
                    failed.push((r, st));
                }
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                failed.push((r, child.wait().expect("wait")));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let mut report = String::new();
    let mut stderr = Vec::new();
    for (r, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("output");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        report += &format!(
            "--- rank {r}\n{}{err}",
            String::from_utf8_lossy(&out.stdout)
        );
        stderr.push(err);
    }
    assert!(failed.is_empty(), "ranks failed: {failed:?}\n{report}");
    stderr
}

/// Compiles the C client once per test process.
fn c_client() -> PathBuf {
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        let lib = lib_dir();
        let exe = std::env::temp_dir().join(format!("ampccl-c-client-{}", std::process::id()));
        let st = Command::new("cc")
            .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(crate_dir().join("include"))
            .arg(crate_dir().join("tests/c/collectives.c"))
            .arg("-L")
            .arg(&lib)
            .arg("-lampccl")
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-o")
            .arg(&exe)
            .status()
            .expect("run cc");
        assert!(st.success(), "cc failed");
        exe
    })
    .clone()
}

fn run_c(world: usize) {
    let exe = c_client();
    launch(world, &[exe.to_str().expect("utf-8 path")], &[]);
}

/// The client's refused calls (null buffers, bad enums, a bad root, ...) write nothing to
/// standard error under the default log filter, as NCCL is silent unless asked: the reason is
/// in `ampcclGetLastError`, which the client checks.
#[test]
fn refused_calls_are_silent_by_default() {
    let exe = c_client();
    let stderr = launch(
        2,
        &[exe.to_str().expect("utf-8 path")],
        &[("AMPCCL_LOG", String::new())],
    );
    for (rank, err) in stderr.iter().enumerate() {
        assert!(err.trim().is_empty(), "rank {rank} logged:\n{err}");
    }
}

#[test]
fn c_client_2_ranks() {
    run_c(2);
}

#[test]
fn c_client_3_ranks() {
    run_c(3);
}

#[test]
fn c_client_4_ranks() {
    run_c(4);
}

#[test]
fn python_client_2_ranks() {
    let lib = lib_dir().join("libampccl.so");
    let script = crate_dir().join("tests/python/client.py");
    launch(
        2,
        &["python3", script.to_str().expect("utf-8 path")],
        &[("AMPCCL_LIB", lib.display().to_string())],
    );
}
