/* A system-call timeline of a communication library's data path, cheap enough for two ranks
 * sharing two CPUs (`perf record -e raw_syscalls:*` doubled the time per call there). Loaded
 * with LD_PRELOAD, it wraps the socket calls libfabric's `tcp` provider and ampccl's TCP
 * provider make (sendmsg, send, sendto, recv, recvfrom, recvmsg, readv, writev), read and
 * write (libfabric signals its queues' wait objects with them), epoll_wait and poll, times
 * each with CLOCK_MONOTONIC (one clock for every process of the machine), and at exit writes
 * one line per call to $SYSCALL_TIMELINE.<pid>:
 *
 *   start_us end_us tid call result
 *
 * epoll_wait calls that return nothing within 20 us are left out (a polling loop makes
 * millions). At most 2^21 calls per process are kept. benches/scripts/syscall_timeline.py
 * merges the files of all ranks into one timeline or per-call sums.
 *
 *   cc -O2 -shared -fPIC -o /tmp/syscall_timeline.so benches/scripts/syscall_timeline.c -ldl
 *   LD_PRELOAD=/tmp/syscall_timeline.so SYSCALL_TIMELINE=/tmp/tl/out \
 *       target/release/ampccl-hosts -k 2 -- ... target/release/ampccl-perf -o allreduce ...
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAX_CALLS (1 << 21)
#define QUIET_EPOLL_US 20.0

enum call { SENDMSG, SEND, SENDTO, RECV, RECVFROM, RECVMSG, READV, WRITEV, EPOLL, POLL, READ, WRITE };
static const char *const NAMES[] = {"sendmsg", "send",  "sendto", "recv",       "recvfrom",
                                    "recvmsg", "readv", "writev", "epoll_wait", "poll", "read", "write"};

struct record {
    double start, end;
    int tid;
    enum call call;
    long result;
};

static struct record records[MAX_CALLS];
static atomic_long taken;
static __thread int my_tid;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void keep(enum call c, double start, double end, long result) {
    if (c == EPOLL && result == 0 && end - start < QUIET_EPOLL_US)
        return;
    if (!my_tid)
        my_tid = (int)syscall(SYS_gettid);
    long i = atomic_fetch_add(&taken, 1);
    if (i < MAX_CALLS)
        records[i] = (struct record){start, end, my_tid, c, result};
}

__attribute__((destructor)) static void write_out(void) {
    const char *base = getenv("SYSCALL_TIMELINE");
    if (!base)
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", base, (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    long n = taken < MAX_CALLS ? taken : MAX_CALLS;
    for (long i = 0; i < n; i++)
        fprintf(f, "%.2f %.2f %d %s %ld\n", records[i].start, records[i].end, records[i].tid,
                NAMES[records[i].call], records[i].result);
    fclose(f);
}

/* Defines `name` to call the next definition (libc's) between two clock readings. */
#define WRAP(c, ret, name, params, args)                                                    \
    ret name params {                                                                      \
        static ret(*real) params;                                                          \
        if (!real)                                                                         \
            real = (ret(*) params)dlsym(RTLD_NEXT, #name);                                 \
        double start = now_us();                                                           \
        ret r = real args;                                                                 \
        keep(c, start, now_us(), (long)r);                                                 \
        return r;                                                                          \
    }

WRAP(SENDMSG, ssize_t, sendmsg, (int fd, const struct msghdr *m, int fl), (fd, m, fl))
WRAP(SEND, ssize_t, send, (int fd, const void *b, size_t l, int fl), (fd, b, l, fl))
WRAP(SENDTO, ssize_t, sendto,
     (int fd, const void *b, size_t l, int fl, const struct sockaddr *a, socklen_t al),
     (fd, b, l, fl, a, al))
WRAP(RECV, ssize_t, recv, (int fd, void *b, size_t l, int fl), (fd, b, l, fl))
WRAP(RECVFROM, ssize_t, recvfrom,
     (int fd, void *b, size_t l, int fl, struct sockaddr *a, socklen_t *al),
     (fd, b, l, fl, a, al))
WRAP(RECVMSG, ssize_t, recvmsg, (int fd, struct msghdr *m, int fl), (fd, m, fl))
WRAP(READV, ssize_t, readv, (int fd, const struct iovec *v, int n), (fd, v, n))
WRAP(WRITEV, ssize_t, writev, (int fd, const struct iovec *v, int n), (fd, v, n))
WRAP(EPOLL, int, epoll_wait, (int e, struct epoll_event *ev, int m, int t), (e, ev, m, t))
WRAP(POLL, int, poll, (struct pollfd *f, nfds_t n, int t), (f, n, t))
WRAP(READ, ssize_t, read, (int fd, void *b, size_t l), (fd, b, l))
WRAP(WRITE, ssize_t, write, (int fd, const void *b, size_t l), (fd, b, l))
