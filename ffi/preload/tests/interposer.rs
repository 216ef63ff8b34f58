//! CPU tests of the interposer against a fake `libnccl.so.2` (`tests/c/fake_nccl.c`) that logs
//! every call: pass-through with and without `AMPCCL_ENABLE`, the re-entry guard (the fake's
//! `ncclCommInitAll` calls the public `ncclCommInitRank`, which comes back through the
//! interposer), and the lookup of the real NCCL when it was loaded `RTLD_LOCAL`. Without CUDA
//! every communicator stays fast-only, so each call must reach NCCL whole and exactly once.
//!
//! The same fake built with `-DFAKE_NCCL_CORE` is an older NCCL (only the entry points of
//! NCCL 2.x before 2.4), driven by `tests/c/partial.c`: what it has passes through, what it
//! lacks fails alone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

#[path = "../../tests/support/cdylib.rs"]
mod cdylib;

struct Built {
    preload: PathBuf,
    dir: PathBuf,
}

fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("run cc");
    assert!(
        out.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the preload library and the C pieces (once per test process).
fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        let preload = cdylib::build("ampccl-preload", "libampccl_preload.so", manifest)
            .join("libampccl_preload.so");
        let dir = std::env::temp_dir().join(format!("ampccl-preload-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let c = manifest.join("tests/c");
        let src = |f: &str| c.join(f).display().to_string();
        let out = |f: &str| dir.join(f).display().to_string();
        let rpath = format!("-Wl,-rpath,{}", dir.display());
        let ldir = format!("-L{}", dir.display());
        cc(&[
            "-shared",
            "-fPIC",
            "-O1",
            "-Wl,-soname,libnccl.so.2",
            "-o",
            &out("libnccl.so.2"),
            &src("fake_nccl.c"),
        ]);
        std::os::unix::fs::symlink(dir.join("libnccl.so.2"), dir.join("libnccl.so")).ok();
        cc(&[
            "-shared",
            "-fPIC",
            "-O1",
            "-o",
            &out("libuser.so"),
            &src("user.c"),
            &ldir,
            "-lnccl",
            &rpath,
        ]);
        cc(&[
            "-O1",
            "-o",
            &out("client"),
            &src("client.c"),
            &src("user.c"),
            &ldir,
            "-lnccl",
            &rpath,
        ]);
        cc(&[
            "-O1",
            "-DLOCAL",
            "-o",
            &out("client_local"),
            &src("client.c"),
            "-ldl",
        ]);
        // The older NCCL, in a folder of its own under the same soname.
        let core = dir.join("core");
        std::fs::create_dir_all(&core).expect("core dir");
        let core_lib = core.join("libnccl.so.2").display().to_string();
        cc(&[
            "-shared",
            "-fPIC",
            "-O1",
            "-DFAKE_NCCL_CORE",
            "-Wl,-soname,libnccl.so.2",
            "-o",
            &core_lib,
            &src("fake_nccl.c"),
        ]);
        cc(&[
            "-O1",
            "-o",
            &out("partial"),
            &src("partial.c"),
            &core_lib,
            &format!("-Wl,-rpath,{}", core.display()),
            "-ldl",
        ]);
        Built { preload, dir }
    })
}

/// Runs a client with the given environment; returns (success, stdout, stderr).
fn run(bin: &str, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let b = built();
    let out = Command::new(b.dir.join(bin))
        .args(args)
        .env_remove("AMPCCL_ENABLE")
        .envs(env.iter().copied())
        .output()
        .expect("run client");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn preload() -> String {
    built().preload.display().to_string()
}

/// The fake NCCL's log of a run of `user_run()` with no interposer.
fn reference_log() -> String {
    let (ok, out, err) = run("client", &[], &[]);
    assert!(ok, "{out}{err}");
    out
}

#[test]
fn without_cuda_every_call_reaches_nccl_whole_and_once() {
    let reference = reference_log();
    assert!(
        reference.contains("AllReduce count=268435456 dt=7 op=0 rank=0"),
        "{reference}"
    );
    let (ok, out, err) = run(
        "client",
        &[],
        &[("LD_PRELOAD", &preload()), ("AMPCCL_LOG", "debug")],
    );
    assert!(ok, "{out}{err}");
    assert_eq!(
        out, reference,
        "the interposer must pass every call on unchanged\n{err}"
    );
    // One communicator from InitRank, one from the split, two from InitAll — the InitRank calls
    // the fake's InitAll makes internally come back through the interposer and must pass
    // straight through (re-entry guard), or the count would be 6.
    assert_eq!(err.matches("communicator registered").count(), 4, "{err}");
}

/// Rendezvous segments in `/dev/shm` (`ampccl.rdv.*`).
fn rendezvous_files() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("ampccl.rdv."))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn no_rendezvous_segment_outlives_the_program() {
    let before = rendezvous_files();
    let (ok, out, err) = run("client", &[], &[("LD_PRELOAD", &preload())]);
    assert!(ok, "{out}{err}");
    // Other tests may be running clients right now: only names this run could have left and
    // that are still there a moment later count.
    std::thread::sleep(std::time::Duration::from_millis(200));
    let left: Vec<_> = rendezvous_files()
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    let (ok2, out2, err2) = run("client", &[], &[("LD_PRELOAD", &preload())]);
    assert!(ok2, "{out2}{err2}");
    let stale: Vec<_> = left
        .iter()
        .filter(|n| rendezvous_files().contains(n))
        .collect();
    assert!(stale.is_empty(), "segments left in /dev/shm: {stale:?}");
}

#[test]
fn disabled_is_a_pure_pass_through() {
    let reference = reference_log();
    let env = [
        ("LD_PRELOAD", preload()),
        ("AMPCCL_ENABLE", "0".into()),
        ("AMPCCL_LOG", "debug".into()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let (ok, out, err) = run("client", &[], &env);
    assert!(ok, "{out}{err}");
    assert_eq!(out, reference);
    assert!(!err.contains("communicator registered"), "{err}");
}

#[test]
fn finds_nccl_loaded_rtld_local() {
    let reference = reference_log();
    let lib = built().dir.join("libuser.so").display().to_string();
    let (ok, out, err) = run(
        "client_local",
        &[&lib],
        &[("LD_PRELOAD", &preload()), ("AMPCCL_LOG", "debug")],
    );
    assert!(ok, "{out}{err}");
    assert_eq!(out, reference, "{err}");
    assert_eq!(err.matches("communicator registered").count(), 4, "{err}");
}

#[test]
fn pass_through_cost_is_reported() {
    // Not a timed assertion (machines are noisy): the figure goes to docs/GPU.md from
    // `client bench`; here only that the measurement runs with and without the interposer.
    for env in [
        vec![],
        vec![("LD_PRELOAD", preload())],
        vec![("LD_PRELOAD", preload()), ("AMPCCL_ENABLE", "0".into())],
    ] {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (ok, out, err) = run("client", &["bench", "100000"], &env);
        assert!(ok && out.starts_with("ns_per_call "), "{out}{err}");
    }
}

/// `AMPCCL_ENABLE` unset (on) and `0`, each with the interposer preloaded and debug logs.
fn preloaded(enable: Option<&str>) -> Vec<(&'static str, String)> {
    let mut env = vec![("LD_PRELOAD", preload()), ("AMPCCL_LOG", "debug".into())];
    env.extend(enable.map(|e| ("AMPCCL_ENABLE", e.to_string())));
    env
}

fn run_env(bin: &str, args: &[&str], env: &[(&'static str, String)]) -> (bool, String, String) {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    run(bin, args, &env)
}

/// The log line naming a function the real NCCL lacks.
fn missing_line(name: &str) -> String {
    format!("the real NCCL does not export {name} ")
}

/// The entry points the interposer wraps that NCCL 2.x before 2.4 lacks.
const NEWER: [&str; 5] = [
    "ncclCommSplit",
    "ncclCommInitRankConfig",
    "ncclCommInitRankScalable",
    "ncclCommGetAsyncError",
    "ncclCommAbort",
];

/// The entry points the interposer wraps that NCCL 2.x before 2.4 has.
const CORE: [&str; 12] = [
    "ncclCommInitRank",
    "ncclCommInitAll",
    "ncclCommDestroy",
    "ncclCommCuDevice",
    "ncclCommUserRank",
    "ncclCommCount",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
];

#[test]
fn an_older_nccl_passes_its_calls_through_enabled_or_not() {
    let (ok, reference, err) = run("partial", &["core"], &[]);
    assert!(ok, "{reference}{err}");
    assert!(
        reference.contains("AllGather count=268435456 dt=7 rank=0")
            && reference.contains("GroupEnd depth=1"),
        "{reference}"
    );
    for enable in [None, Some("0")] {
        let (ok, out, err) = run_env("partial", &["core"], &preloaded(enable));
        assert!(ok, "AMPCCL_ENABLE={enable:?}: {out}{err}");
        assert_eq!(
            out, reference,
            "AMPCCL_ENABLE={enable:?}: every call passes on unchanged\n{err}"
        );
        for name in CORE {
            assert!(!err.contains(&missing_line(name)), "{name}: {err}");
        }
        let registered = err.matches("communicator registered").count();
        if enable == Some("0") {
            // Nothing needed a function the old NCCL lacks, so nothing is said about one.
            assert!(!err.contains("does not export"), "{err}");
            assert_eq!(registered, 0, "{err}");
        } else {
            // The bookkeeping stays on (InitRank, and InitAll's two): only the PCIe path,
            // which needs ncclCommGetAsyncError (and the allgather split ncclSend), is off.
            assert_eq!(registered, 3, "{err}");
            for name in NEWER.iter().chain(&["ncclSend", "ncclRecv"]) {
                assert!(
                    err.matches(&missing_line(name)).count() <= 1,
                    "{name}: {err}"
                );
            }
        }
    }
}

#[test]
fn an_older_nccl_fails_only_what_it_lacks_and_names_it_once() {
    // The stand-in really lacks them: without the interposer the program finds none.
    let (ok, reference, err) = run("partial", &["missing"], &[]);
    assert!(ok, "{reference}{err}");
    for name in NEWER {
        assert_eq!(
            reference.matches(&format!("{name} absent\n")).count(),
            2,
            "{reference}"
        );
    }
    let log = |out: &str| {
        out.split_once("----- fake nccl log\n")
            .map(|(_, l)| l.to_string())
    };
    let reference_log = log(&reference).expect("the fake's log");
    assert!(
        reference_log.contains("AllReduce count=268435456")
            && reference_log.contains("CommDestroy rank=0"),
        "{reference_log}"
    );
    for enable in [None, Some("0")] {
        let (ok, out, err) = run_env("partial", &["missing"], &preloaded(enable));
        assert!(ok, "AMPCCL_ENABLE={enable:?}: {out}{err}");
        for name in NEWER {
            assert_eq!(
                out.matches(&format!("{name} -> 2 (unhandled system error)\n"))
                    .count(),
                2,
                "AMPCCL_ENABLE={enable:?}: {name} fails with ncclSystemError\n{out}"
            );
            assert_eq!(
                err.matches(&missing_line(name)).count(),
                1,
                "AMPCCL_ENABLE={enable:?}: {name} is named once\n{err}"
            );
        }
        // The failed calls reached nothing, and the communicator still works.
        assert_eq!(log(&out), Some(reference_log.clone()), "{err}");
        // Only the communicator NCCL made is registered: a failed init counts no arrival.
        let registered = if enable.is_none() { 1 } else { 0 };
        assert_eq!(
            err.matches("communicator registered").count(),
            registered,
            "{err}"
        );
    }
}
