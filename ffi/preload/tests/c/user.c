/* The application side of the interposer tests, as a library linked against libnccl.so.2 (so it
 * can be loaded RTLD_LOCAL, like PyTorch's libtorch_cuda.so) and as a program (client.c). */
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl_core.h"
int ncclCommSplit(ncclComm_t, int, int, ncclComm_t *, void *);
int ncclCommAbort(ncclComm_t);
int ncclCommGetAsyncError(ncclComm_t, int *);

/* Every wrapped entry point once, large counts included (1 Gi floats). */
int user_run(void) {
  /* An id of this process (parallel test processes must not meet in one domain). */
  ncclUniqueId id;
  memset(&id, 3, sizeof id);
  snprintf(id.internal, sizeof id.internal, "user-%d", (int)getpid());
  ncclComm_t c, all[2], sub;
  const size_t big = (size_t)1 << 28;
  CHECK(ncclCommInitRank(&c, 1, id, 0));
  CHECK(each_collective(c, big));
  CHECK(ncclCommSplit(c, 0, 0, &sub, NULL));
  CHECK(ncclCommInitAll(all, 2, NULL));
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(NULL, NULL, big, 7, 0, all[0], NULL));
  CHECK(ncclAllReduce(NULL, NULL, big, 7, 0, all[1], NULL));
  CHECK(ncclGroupEnd());
  int async_error = -1;
  CHECK(ncclCommGetAsyncError(c, &async_error));
  CHECK(async_error);
  CHECK(ncclCommDestroy(sub));
  CHECK(ncclCommDestroy(all[0]));
  CHECK(ncclCommAbort(all[1]));
  CHECK(ncclCommDestroy(c));
  return 0;
}

/* Nanoseconds per small ncclAllReduce through whatever is in front of the fake library. */
double user_ns_per_call(long n) {
  ncclUniqueId id;
  memset(&id, 5, sizeof id);
  ncclComm_t c;
  if (ncclCommInitRank(&c, 1, id, 0)) return -1;
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (long i = 0; i < n; i++) ncclAllReduce(NULL, NULL, 8, 7, 0, c, NULL);
  clock_gettime(CLOCK_MONOTONIC, &b);
  ncclCommDestroy(c);
  return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
}
