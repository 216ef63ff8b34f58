/* CPU time of a rank that has nothing to do, through the C ABI: with no operation pending,
 * and blocked in an allreduce whose peer comes late.
 *
 * Each rank joins from the environment (ampcclCommInitFromEnv: ampccl-run, ampccl-hosts,
 * torchrun and mpirun set it), runs one allreduce, then
 *   - sleeps IDLE_S seconds with the communicator idle, and
 *   - runs ROUNDS allreduces of one float for which the last rank arrives LATE_MS late:
 *     the other ranks wait inside ampcclStreamSynchronize meanwhile.
 * Rank 0 prints its CPU time (user + system, all threads, getrusage) per second of each, as a
 * share of one core, and the median time from the late rank's call to its own return
 * (CLOCK_MONOTONIC, which the network namespaces of emulated hosts share).
 *
 *   cc -O2 -o /tmp/idle_cpu benches/scripts/idle_cpu.c -Iffi/include -Ltarget/release \
 *       -lampccl -Wl,-rpath,$PWD/target/release
 *   target/release/ampccl-run -n 2 /tmp/idle_cpu
 *   target/release/ampccl-hosts -k 2 -- /tmp/idle_cpu */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

#include "ampccl.h"

enum { IDLE_S = 3, ROUNDS = 5, LATE_MS = 1000 };

/* Exits with the library's message when a call failed. */
static void check(ampcclResult_t r, const char *call) {
  if (r == ampcclSuccess) return;
  fprintf(stderr, "%s: %s (%s)\n", call, ampcclGetErrorString(r), ampcclGetLastError(NULL));
  exit(1);
}
#define CHECK(cmd) check((cmd), #cmd)

static double cpu_s(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return r.ru_utime.tv_sec + r.ru_utime.tv_usec * 1e-6 + r.ru_stime.tv_sec +
         r.ru_stime.tv_usec * 1e-6;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec t = {(time_t)s, (long)((s - (time_t)s) * 1e9)};
  while (nanosleep(&t, &t) != 0) {
  }
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(void) {
  ampcclComm_t comm;
  ampcclStream_t s;
  int rank, world;
  CHECK(ampcclCommInitFromEnv(&comm));
  CHECK(ampcclCommUserRank(comm, &rank));
  CHECK(ampcclCommCount(comm, &world));
  CHECK(ampcclStreamCreate(&s));
  /* Each round's late call time travels in the allreduce itself: the late rank contributes
   * it, the others 0, so the sum is the late rank's clock at its call. */
  double in, out;
#define ALLREDUCE(x)                                                                 \
  do {                                                                               \
    in = (x);                                                                        \
    CHECK(ampcclAllReduce(&in, &out, 1, ampcclFloat64, ampcclSum, comm, s));         \
    CHECK(ampcclStreamSynchronize(s));                                               \
  } while (0)
  ALLREDUCE(0);

  double c0 = cpu_s(), t0 = now_s();
  sleep_s(IDLE_S);
  double idle = (cpu_s() - c0) / (now_s() - t0);

  double wait_cpu = 0, wait_wall = 0, wake[ROUNDS];
  for (int i = 0; i < ROUNDS; i++) {
    ALLREDUCE(0); /* line up */
    if (rank == world - 1) {
      sleep_s(LATE_MS / 1e3);
      ALLREDUCE(now_s());
    } else {
      double c = cpu_s(), t = now_s();
      ALLREDUCE(0);
      double end = now_s();
      wait_cpu += cpu_s() - c, wait_wall += end - t;
      wake[i] = end - out;
    }
  }
  if (rank == 0) {
    qsort(wake, ROUNDS, sizeof wake[0], cmp);
    printf("idle: %.2f %% of a core; waiting for a peer %d ms late: %.2f %% of a core, "
           "returned %.0f us after its call (median of %d)\n",
           idle * 100, LATE_MS, wait_cpu / wait_wall * 100, wake[ROUNDS / 2] * 1e6, ROUNDS);
  }
  CHECK(ampcclStreamDestroy(s));
  CHECK(ampcclCommDestroy(comm));
  return 0;
}
