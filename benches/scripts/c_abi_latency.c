/* Latency of collectives through the C ABI (libampccl.so), the loop of `ampccl-perf` for the
 * Rust blocking call: warm-up, a barrier, then `-n` timed iterations; prints the mean time per
 * iteration in µs of the slowest rank. Driven by c_abi_latency.py, which builds it, alternates
 * it with ampccl-perf (and with other builds of the library) and quotes medians.
 *
 *   c_abi_latency -g 2 [-b BYTES] [-n ITERS] [-w WARMUP] [-m MODE]
 *
 * With -g N it is the launcher: it makes the unique id (and so hosts the rendezvous) and starts
 * N copies of itself with AMPCCL_UNIQUE_ID, RANK and WORLD_SIZE set; each rank runs MODE:
 *   sync     allreduce (float sum, out of place) on a stream + ampcclStreamSynchronize
 *   event    allreduce on a stream + ampcclEventRecord + ampcclEventSynchronize
 *   comm     allreduce on the NULL stream + ampcclCommSynchronize
 *   two      allreduce on each of two streams of one communicator, then synchronize both
 *   twocomm  allreduce on each of two communicators (the second one a split), each on its own
 *            stream, then synchronize both
 * BYTES is the size of each allreduce; in two and twocomm an iteration is two of them. Each
 * rank pins itself to one CPU (rank modulo the CPUs it may use) as ampccl-perf's -g ranks do,
 * so that two lock-step ranks never share a core; AMPCCL_PERF_PIN=0 turns it off. */
#define _GNU_SOURCE
#include <sched.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ampccl.h"

extern char **environ;

static int rank = -1;

#define CHECK(cmd)                                                                          \
  do {                                                                                      \
    ampcclResult_t r_ = (cmd);                                                              \
    if (r_ != ampcclSuccess) {                                                              \
      fprintf(stderr, "rank %d: %s:%d: %s -> %d (%s): %s\n", rank, __FILE__, __LINE__, #cmd, \
              (int)r_, ampcclGetErrorString(r_), ampcclGetLastError(NULL));                 \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

/* Pins this process to the r-th CPU (modulo) of its affinity mask, as ampccl-perf -g does. */
static void pin(int r) {
  const char *off = getenv("AMPCCL_PERF_PIN");
  cpu_set_t set;
  if ((off && !strcmp(off, "0")) || sched_getaffinity(0, sizeof set, &set) != 0) return;
  int n = CPU_COUNT(&set);
  if (n == 0) return;
  int k = r % n;
  for (int c = 0; c < CPU_SETSIZE; c++) {
    if (CPU_ISSET(c, &set) && k-- == 0) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      sched_setaffinity(0, sizeof one, &one);
      return;
    }
  }
}

static int launch(int n, char **argv) {
  ampcclUniqueId id;
  char hex[512], rs[16], ws[16];
  CHECK(ampcclGetUniqueId(&id));
  CHECK(ampcclUniqueIdToString(&id, hex, sizeof hex));
  snprintf(ws, sizeof ws, "%d", n);
  setenv("AMPCCL_UNIQUE_ID", hex, 1);
  setenv("WORLD_SIZE", ws, 1);
  pid_t pids[64];
  if (n < 1 || n > 64) {
    fprintf(stderr, "-g %d: 1 to 64 ranks\n", n);
    return 2;
  }
  for (int r = 0; r < n; r++) {
    snprintf(rs, sizeof rs, "%d", r);
    setenv("RANK", rs, 1);
    if (posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, argv, environ) != 0) {
      perror("posix_spawn");
      return 1;
    }
  }
  int rc = 0;
  for (int r = 0; r < n; r++) {
    int st;
    if (waitpid(pids[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}

/* One iteration of `mode`. */
static void step(const char *mode, ampcclComm_t c0, ampcclComm_t c1, ampcclStream_t s0,
                 ampcclStream_t s1, ampcclEvent_t ev, const float *in, float *out, float *out1,
                 size_t count) {
  if (!strcmp(mode, "sync")) {
    CHECK(ampcclAllReduce(in, out, count, ampcclFloat32, ampcclSum, c0, s0));
    CHECK(ampcclStreamSynchronize(s0));
  } else if (!strcmp(mode, "event")) {
    CHECK(ampcclAllReduce(in, out, count, ampcclFloat32, ampcclSum, c0, s0));
    CHECK(ampcclEventRecord(ev, s0));
    CHECK(ampcclEventSynchronize(ev));
  } else if (!strcmp(mode, "comm")) {
    CHECK(ampcclAllReduce(in, out, count, ampcclFloat32, ampcclSum, c0, NULL));
    CHECK(ampcclCommSynchronize(c0));
  } else if (!strcmp(mode, "two") || !strcmp(mode, "twocomm")) {
    CHECK(ampcclAllReduce(in, out, count, ampcclFloat32, ampcclSum, c0, s0));
    CHECK(ampcclAllReduce(in, out1, count, ampcclFloat32, ampcclSum, c1, s1));
    CHECK(ampcclStreamSynchronize(s0));
    CHECK(ampcclStreamSynchronize(s1));
  } else {
    fprintf(stderr, "unknown mode %s (sync, event, comm, two, twocomm)\n", mode);
    exit(2);
  }
}

int main(int argc, char **argv) {
  size_t bytes = 8;
  long iters = 100000, warmup = 1000;
  int ranks = 0;
  const char *mode = "sync";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "-g")) ranks = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "-b")) bytes = strtoull(argv[i + 1], NULL, 0);
    else if (!strcmp(argv[i], "-n")) iters = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "-w")) warmup = atol(argv[i + 1]);
    else if (!strcmp(argv[i], "-m")) mode = argv[i + 1];
    else {
      fprintf(stderr, "usage: %s -g N [-b BYTES] [-n ITERS] [-w WARMUP] [-m MODE]\n", argv[0]);
      return 2;
    }
  }
  if (!getenv("RANK")) {
    if (ranks < 1) {
      fprintf(stderr, "RANK is not set: start it with -g N (N local ranks)\n");
      return 2;
    }
    return launch(ranks, argv);
  }
  rank = atoi(getenv("RANK"));
  int world = atoi(getenv("WORLD_SIZE"));
  pin(rank);
  ampcclUniqueId id;
  CHECK(ampcclUniqueIdFromString(getenv("AMPCCL_UNIQUE_ID"), &id));
  ampcclComm_t c0, c1 = NULL;
  CHECK(ampcclCommInitRank(&c0, world, id, rank));
  int two_comms = !strcmp(mode, "twocomm");
  if (two_comms) CHECK(ampcclCommSplit(c0, 0, rank, &c1, NULL));
  else c1 = c0;
  ampcclStream_t s0, s1;
  ampcclEvent_t ev;
  CHECK(ampcclStreamCreate(&s0));
  CHECK(ampcclStreamCreate(&s1));
  CHECK(ampcclEventCreate(&ev));
  size_t count = bytes / sizeof(float);
  if (count == 0) count = 1;
  float *in = malloc(count * sizeof(float)), *out = malloc(count * sizeof(float));
  float *out1 = malloc(count * sizeof(float));
  if (!in || !out || !out1) {
    fprintf(stderr, "rank %d: out of memory for %zu bytes\n", rank, bytes);
    return 1;
  }
  for (size_t i = 0; i < count; i++) in[i] = (float)(rank + 1 + i % 7);
  for (long i = 0; i < warmup; i++) step(mode, c0, c1, s0, s1, ev, in, out, out1, count);
  /* The result of the warm-up's last iteration. */
  for (size_t i = 0; i < count; i += 1 + count / 97) {
    float want = 0;
    for (int r = 0; r < world; r++) want += (float)(r + 1 + i % 7);
    if (out[i] != want) {
      fprintf(stderr, "rank %d: out[%zu] = %g, want %g\n", rank, i, out[i], want);
      return 1;
    }
  }
  /* A barrier: an allreduce everyone waits for. */
  double t[1] = {0};
  CHECK(ampcclAllReduce(t, t, 1, ampcclFloat64, ampcclSum, c0, s0));
  CHECK(ampcclStreamSynchronize(s0));
  double t0 = now_us();
  for (long i = 0; i < iters; i++) step(mode, c0, c1, s0, s1, ev, in, out, out1, count);
  t[0] = (now_us() - t0) / (double)(iters > 0 ? iters : 1);
  CHECK(ampcclAllReduce(t, t, 1, ampcclFloat64, ampcclMax, c0, s0));
  CHECK(ampcclStreamSynchronize(s0));
  if (rank == 0)
    printf("c_abi_latency mode=%s bytes=%zu ranks=%d iters=%ld us=%.3f\n", mode, bytes, world,
           iters, t[0]);
  CHECK(ampcclEventDestroy(ev));
  CHECK(ampcclStreamDestroy(s0));
  CHECK(ampcclStreamDestroy(s1));
  if (two_comms) CHECK(ampcclCommDestroy(c1));
  CHECK(ampcclCommDestroy(c0));
  free(in);
  free(out);
  free(out1);
  return 0;
}
