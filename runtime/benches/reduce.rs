//! Reduction kernel throughput: `Sum` of two distinct inputs into a third buffer, for every data
//! type, at 1 MiB (cache-resident-ish) and 64 MiB (memory-bound) of output, next to a plain
//! `copy_from_slice` of the same output size. Throughput is reported in output bytes.

use ampccl_runtime::reduce::reduce;
use ampccl_runtime::{DataType, ReduceOp};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;

const SIZES: [(usize, &str, usize); 2] = [(1 << 20, "1MiB", 50), (64 << 20, "64MiB", 10)];

fn bench_reduce(c: &mut Criterion) {
    for (bytes, label, samples) in SIZES {
        // `u64` storage so every element type is aligned. 0x3C bytes are normal, moderate values
        // in every float format (no subnormals, no NaNs).
        let words = bytes / 8;
        let a = vec![0x3C3C_3C3C_3C3C_3C3Cu64; words];
        let b = vec![0x3C3C_3C3C_3C3C_3C3Cu64; words];
        let mut dst = vec![0u64; words];

        let mut group = c.benchmark_group(format!("reduce_sum_{label}"));
        group.throughput(Throughput::Bytes(bytes as u64));
        group.sample_size(samples);
        for dtype in DataType::ALL {
            let count = bytes / dtype.size();
            group.bench_function(dtype.name(), |bench| {
                bench.iter(|| {
                    // SAFETY: the three buffers are distinct live vectors of `bytes` bytes, aligned
                    // to 8, so valid and aligned for `count` elements of any data type.
                    unsafe {
                        reduce(
                            dtype,
                            ReduceOp::Sum,
                            black_box(dst.as_mut_ptr().cast()),
                            black_box(a.as_ptr().cast()),
                            black_box(b.as_ptr().cast()),
                            count,
                        )
                    }
                })
            });
        }
        group.bench_function("copy", |bench| {
            bench.iter(|| black_box(&mut dst[..]).copy_from_slice(black_box(&a[..])))
        });
        group.finish();
    }
}

criterion_group!(benches, bench_reduce);
criterion_main!(benches);
