/* What one pass for two copies saves (the tee of ampccl_runtime::copy): one thread does what a
 * rank of a 2-rank allgather does with its N-byte block (default 512 KiB, cache-resident):
 * copy the input into its output and into a window, and copy a window out into the output's
 * other half. Three ways: three separate copies; the first two fused (each vector stored
 * twice); the first two blocked (8 KiB to the output, then the same 8 KiB, from the L1 cache,
 * to the window: ampccl_runtime::copy::tee). Prints the mean over 2000 calls of each, 5 times.
 *
 *   cc -O2 -o /tmp/tee_probe benches/scripts/tee_probe.c && /tmp/tee_probe [bytes]
 *
 * On the 2-core AMD EPYC (Zen 4) VM of docs/PERFORMANCE.md, November 2026: 33.3 us for three
 * copies, 27.5 fused, 28.4 blocked (33.4-38, 27.5-32.3 and 28.4-32.8 over several runs). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CALLS 2000
#define BLOCK 8192

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

#define LOAD4(s)                                                                   \
    __m256i a = _mm256_loadu_si256((const void *)(s)),                         \
            b = _mm256_loadu_si256((const void *)((s) + 32)),                  \
            c = _mm256_loadu_si256((const void *)((s) + 64)),                  \
            e = _mm256_loadu_si256((const void *)((s) + 96))
#define STORE4(d)                                                                  \
    _mm256_storeu_si256((void *)(d), a);                                       \
    _mm256_storeu_si256((void *)((d) + 32), b);                                \
    _mm256_storeu_si256((void *)((d) + 64), c);                                \
    _mm256_storeu_si256((void *)((d) + 96), e)

/* n is a multiple of 128. */
__attribute__((target("avx2"))) static void copy1(char *d, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 128) {
        LOAD4(s + i);
        STORE4(d + i);
    }
}

__attribute__((target("avx2"))) static void fused(char *d, char *d2, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 128) {
        LOAD4(s + i);
        STORE4(d + i);
        STORE4(d2 + i);
    }
}

static void blocked(char *d, char *d2, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += BLOCK) {
        size_t m = n - i < BLOCK ? n - i : BLOCK;
        copy1(d + i, s + i, m);
        copy1(d2 + i, s + i, m);
    }
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : 512 * 1024;
    n -= n % 128;
    char *in = aligned_alloc(4096, n), *out = aligned_alloc(4096, 2 * n), *win = aligned_alloc(4096, n);
    memset(in, 1, n);
    memset(out, 2, 2 * n);
    memset(win, 3, n);
    for (int r = 0; r < 5; r++) {
        double t0 = now_us();
        for (int i = 0; i < CALLS; i++) {
            copy1(out, in, n);
            copy1(win, out, n);
            copy1(out + n, win, n);
        }
        double t1 = now_us();
        for (int i = 0; i < CALLS; i++) {
            fused(out, win, in, n);
            copy1(out + n, win, n);
        }
        double t2 = now_us();
        for (int i = 0; i < CALLS; i++) {
            blocked(out, win, in, n);
            copy1(out + n, win, n);
        }
        double t3 = now_us();
        printf("%zu bytes: three copies %.2f us, fused %.2f us, blocked %.2f us\n", n,
               (t1 - t0) / CALLS, (t2 - t1) / CALLS, (t3 - t2) / CALLS);
    }
    return 0;
}
