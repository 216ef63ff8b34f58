//! The checked-in header `include/ampccl.h` must equal what cbindgen generates from the crate
//! now (a stale header fails CI). `AMPCCL_BLESS=1` rewrites it instead of comparing.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let path = dir.join("include/ampccl.h");
    if std::env::var_os("AMPCCL_BLESS").is_some() {
        std::fs::write(&path, &fresh).expect("write the header");
        return;
    }
    let tmp = std::env::temp_dir().join(format!("ampccl-{}.h", std::process::id()));
    std::fs::write(&tmp, &fresh).expect("write the fresh header");
    let checked_in = std::fs::read(&path).unwrap_or_default();
    assert!(
        checked_in == fresh,
        "ffi/include/ampccl.h is stale: regenerate it with \
         `AMPCCL_BLESS=1 cargo test -p ampccl-ffi --test header` (fresh copy: {})",
        tmp.display()
    );
    let _ = std::fs::remove_file(tmp);
}
