//! Builds a `cdylib` of this workspace for an integration test: cargo builds no `cdylib` for
//! integration tests, so [`build`] runs `cargo build -p <package> --lib` into the target
//! directory and profile of the running test executable (`<target>/<profile>/deps/<test>`) and
//! returns that profile directory. Shared by the `ampccl-ffi` and `ampccl-preload` tests
//! (included with `#[path]`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds `package`'s library in `manifest_dir`'s workspace and returns the directory that
/// then holds `file` (e.g. `libampccl.so`).
pub fn build(package: &str, file: &str, manifest_dir: &Path) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let profile_dir = exe.parent().and_then(Path::parent).expect("profile dir");
    let target = profile_dir.parent().expect("target dir");
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "test",
        Some(p) => p,
        None => panic!("no profile directory above {}", exe.display()),
    };
    let st = Command::new(env!("CARGO"))
        .args(["build", "-p", package, "--lib", "--profile", profile])
        .env("CARGO_TARGET_DIR", target)
        .current_dir(manifest_dir)
        .status()
        .expect("run cargo build");
    assert!(st.success(), "cargo build -p {package} failed");
    let so = profile_dir.join(file);
    assert!(so.exists(), "{} missing after the build", so.display());
    profile_dir.to_path_buf()
}
