/* A complete 2-process allreduce over libampccl (host memory).
 *
 * Run without arguments: the launcher makes a unique id, then starts itself twice as ranks
 * 0 and 1 (AMPCCL_UNIQUE_ID, RANK, WORLD_SIZE in the environment), like mpirun would.
 * Build and run: see "C API" in README.md. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ampccl.h"

#define CHECK(cmd)                                                                   \
  do {                                                                               \
    ampcclResult_t r_ = (cmd);                                                       \
    if (r_ != ampcclSuccess) {                                                       \
      fprintf(stderr, "%s failed: %s (%s)\n", #cmd, ampcclGetErrorString(r_),        \
              ampcclGetLastError(NULL));                                             \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

enum { WORLD = 2, COUNT = 1 << 20 };

static int rank_main(int rank) {
  ampcclUniqueId id;
  CHECK(ampcclUniqueIdFromString(getenv("AMPCCL_UNIQUE_ID"), &id));
  ampcclComm_t comm;
  CHECK(ampcclCommInitRank(&comm, WORLD, id, rank));
  ampcclStream_t stream;
  CHECK(ampcclStreamCreate(&stream));

  float *send = malloc(COUNT * sizeof(float)), *recv = malloc(COUNT * sizeof(float));
  for (int i = 0; i < COUNT; i++) send[i] = (float)(rank + 1);
  /* Asynchronous, like NCCL: returns at once; the stream says when it is done. */
  CHECK(ampcclAllReduce(send, recv, COUNT, ampcclFloat32, ampcclSum, comm, stream));
  CHECK(ampcclStreamSynchronize(stream));
  for (int i = 0; i < COUNT; i++)
    if (recv[i] != 3.0f) {
      fprintf(stderr, "rank %d: recv[%d] = %f\n", rank, i, recv[i]);
      return 1;
    }
  printf("rank %d: allreduce of %d floats ok (recv[0] = %.1f)\n", rank, COUNT, recv[0]);
  free(send), free(recv);
  CHECK(ampcclStreamDestroy(stream));
  CHECK(ampcclCommDestroy(comm));
  return 0;
}

int main(int argc, char **argv) {
  (void)argc;
  if (getenv("RANK")) return rank_main(atoi(getenv("RANK")));
  /* Launcher: the id's rendezvous root runs in this process until the ranks have met. */
  ampcclUniqueId id;
  char hex[2 * AMPCCL_UNIQUE_ID_BYTES + 1];
  CHECK(ampcclGetUniqueId(&id));
  CHECK(ampcclUniqueIdToString(&id, hex, sizeof hex));
  for (int r = 0; r < WORLD; r++) {
    if (fork() == 0) {
      char rs[16];
      snprintf(rs, sizeof rs, "%d", r);
      setenv("AMPCCL_UNIQUE_ID", hex, 1);
      setenv("RANK", rs, 1);
      setenv("WORLD_SIZE", "2", 1);
      execv("/proc/self/exe", argv);
      perror("execv");
      _exit(127);
    }
  }
  int failed = 0, st;
  while (wait(&st) > 0) failed |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  return failed;
}
