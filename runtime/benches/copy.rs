//! Bulk copy throughput: `memcpy` (`copy_from_slice`) against the stream tasks' copy
//! ([`ampccl_runtime::copy::copy`], streaming stores from `STREAM_MIN` up), from cache-resident
//! to memory-bound sizes. Throughput is reported in bytes copied.

use ampccl_runtime::copy::{STREAM_MIN, copy};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

fn bench_copy(c: &mut Criterion) {
    for mib in [1usize, 4, 16, 64] {
        let bytes = mib << 20;
        let src = vec![0x5Au8; bytes];
        let mut dst = vec![0u8; bytes];
        let mut group = c.benchmark_group(format!("copy_{mib}MiB"));
        group.throughput(Throughput::Bytes(bytes as u64));
        group.sample_size(if mib >= 16 { 10 } else { 30 });
        group.bench_function("memcpy", |b| {
            b.iter(|| black_box(&mut dst[..]).copy_from_slice(black_box(&src[..])))
        });
        group.bench_function(
            if bytes >= STREAM_MIN.bytes() {
                "ampccl (streaming)"
            } else {
                "ampccl (memcpy)"
            },
            |b| {
                b.iter(|| {
                    // SAFETY: two distinct live vectors of `bytes` bytes.
                    unsafe { copy(black_box(dst.as_mut_ptr()), black_box(src.as_ptr()), bytes) }
                })
            },
        );
        group.finish();
    }
}

criterion_group!(benches, bench_copy);
criterion_main!(benches);
