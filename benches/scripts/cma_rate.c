/* What a cross-memory read costs against a local copy (why the broadcast's receiver does not
 * read the root's heap with cross-memory attach, docs/PERFORMANCE.md "Broadcast"): a child
 * process reads its parent's N-byte heap buffer (in the cache) with process_vm_readv into its
 * own, then copies the same bytes locally with memcpy; prints the medians over 200 calls of
 * each, 5 times.
 *
 *   cc -O2 -o /tmp/cma_rate benches/scripts/cma_rate.c && /tmp/cma_rate [bytes, default 4 MiB]
 *
 * On the 2-core AMD EPYC (Zen 4) VM of docs/PERFORMANCE.md, November 2026: 4 MiB 318 us
 * (13.2 GB/s) by process_vm_readv, 89 us (47 GB/s) by memcpy; 512 KiB 40 against 10.7 us. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CALLS 200

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *t) {
    qsort(t, CALLS, sizeof *t, cmp);
    return t[CALLS / 2];
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 0) : 4 << 20;
    char *src = malloc(n);
    if (!src) return 1;
    memset(src, 1, n);
    pid_t parent = getpid(), child = fork();
    if (child < 0) return 1;
    if (child > 0) {
        int st;
        waitpid(child, &st, 0);
        return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
    }
    char *dst = malloc(n);
    double cma[CALLS], local[CALLS];
    if (!dst) return 1;
    memset(dst, 0, n);
    for (int rep = 0; rep < 5; rep++) {
        for (int i = 0; i < CALLS; i++) {
            struct iovec l = {dst, n}, r = {src, n};
            double t0 = now_us();
            if (process_vm_readv(parent, &l, 1, &r, 1, 0) != (ssize_t)n) {
                perror("process_vm_readv");
                return 1;
            }
            cma[i] = now_us() - t0;
        }
        for (int i = 0; i < CALLS; i++) {
            double t0 = now_us();
            memcpy(dst, src, n);
            __asm__ volatile("" : : "r"(dst) : "memory");
            local[i] = now_us() - t0;
        }
        double c = median(cma), m = median(local);
        printf("%zu bytes: process_vm_readv %.1f us (%.1f GB/s), memcpy %.1f us (%.1f GB/s)\n", n,
               c, n / c / 1e3, m, n / m / 1e3);
    }
    return 0;
}
