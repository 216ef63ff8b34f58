//! Peak resident set size of this process (`getrusage`), for the `# Peak RSS` line.

/// Peak RSS of this process in bytes, or `None` when the kernel does not say.
pub fn peak_bytes() -> Option<u64> {
    // SAFETY: `rusage` is plain data and `getrusage` gets a valid pointer to one.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return None;
        }
        ru
    };
    // Linux reports ru_maxrss in KiB.
    u64::try_from(ru.ru_maxrss).ok().map(|kib| kib * 1024)
}

#[cfg(test)]
mod tests {
    #[test]
    fn peak_grows_with_touched_memory() {
        let before = super::peak_bytes().unwrap();
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        let after = super::peak_bytes().unwrap();
        assert!(after >= before.max(64 << 20), "{before} -> {after}");
    }
}
