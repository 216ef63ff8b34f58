/* Host probe for docs/PERFORMANCE.md ("How to measure"): how fast one core hands freshly
 * written lines to another. A producer process copies 512 KiB pieces into slots rotating over a
 * 4 MiB shared window, a consumer process (pinned to the other CPU) copies each out; prints the
 * microseconds per piece. With "s" the producer uses streaming stores.
 *
 *   cc -O2 -o /tmp/handoff_probe benches/scripts/handoff_probe.c && /tmp/handoff_probe [s]
 *
 * On the 2-core AMD EPYC (Zen 4) VM of docs/PERFORMANCE.md, November 2026 (120 alternated
 * pairs): 13 us plain / 34 us streaming normally; 155-223 us plain / 24-30 us streaming in the
 * host's slow spells. */
#define _GNU_SOURCE
#include <immintrin.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PIECE (512 << 10)
#define WINDOW (4 << 20)
#define SLOTS (WINDOW / PIECE)
#define PIECES 3000

struct ctl {
    _Atomic long ready, consumed;
};

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

__attribute__((target("avx2"))) static void copy(char *d, const char *s, size_t n, int stream) {
    for (size_t i = 0; i < n; i += 32) {
        __m256i v = _mm256_loadu_si256((const void *)(s + i));
        if (stream)
            _mm256_stream_si256((void *)(d + i), v);
        else
            _mm256_store_si256((void *)(d + i), v);
    }
    if (stream)
        _mm_sfence();
}

static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}

int main(int argc, char **argv) {
    int stream = argc > 1 && argv[1][0] == 's';
    char *m = mmap(0, 4096 + WINDOW, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    struct ctl *c = (struct ctl *)m;
    char *win = m + 4096;
    char *buf = aligned_alloc(4096, PIECE);
    memset(buf, 1, PIECE);
    double t0 = now_ns();
    pid_t pid = fork();
    if (pid == 0) {
        pin(1);
        for (long g = 0; g < PIECES; g++) {
            while (atomic_load(&c->ready) <= g)
                ;
            copy(buf, win + (g % SLOTS) * PIECE, PIECE, 0);
            atomic_store(&c->consumed, g + 1);
        }
        _exit(0);
    }
    pin(0);
    for (long g = 0; g < PIECES; g++) {
        while (g - atomic_load(&c->consumed) >= SLOTS - 1)
            ;
        copy(win + (g % SLOTS) * PIECE, buf, PIECE, stream);
        atomic_store(&c->ready, g + 1);
    }
    waitpid(pid, 0, 0);
    printf("%.1f\n", (now_ns() - t0) / PIECES / 1e3);
    return 0;
}
