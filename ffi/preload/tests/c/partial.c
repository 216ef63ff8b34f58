/* The application side of the tests with an older NCCL: linked against the fake built with
 * -DFAKE_NCCL_CORE (only the entry points of NCCL 2.x before 2.4).
 *  - `partial core`: the core calls (every wrapped one the old NCCL has), then the fake's log;
 *  - `partial missing`: each newer entry point the interposer wraps, found with
 *    dlsym(RTLD_DEFAULT) as a program built against a newer nccl.h binds it (the interposer's
 *    export when it is preloaded, nothing without it), called twice, printing its result; then
 *    core calls on the same communicator, and the fake's log. */
#include <dlfcn.h>
#include <string.h>

#include "nccl_core.h"
const char *fake_log(void);

static const size_t big = (size_t)1 << 28;

static int core(void) {
  ncclUniqueId id;
  ncclComm_t c, all[2];
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&c, 1, id, 0));
  CHECK(each_collective(c, big));
  CHECK(ncclCommInitAll(all, 2, NULL));
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(NULL, NULL, big, 7, 0, all[0], NULL));
  CHECK(ncclAllReduce(NULL, NULL, big, 7, 0, all[1], NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclCommDestroy(all[0]));
  CHECK(ncclCommDestroy(all[1]));
  CHECK(ncclCommDestroy(c));
  return 0;
}

static void report(const char *name, int rc) {
  printf("%s -> %d (%s)\n", name, rc, ncclGetErrorString(rc));
}

static int missing(void) {
  ncclUniqueId id;
  ncclComm_t c, other = NULL;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclCommInitRank(&c, 1, id, 0));
  for (int round = 0; round < 2; round++) {
    void *f;
    if ((f = dlsym(RTLD_DEFAULT, "ncclCommSplit")))
      report("ncclCommSplit", ((int (*)(ncclComm_t, int, int, ncclComm_t *, void *))f)(c, 0, 0, &other, NULL));
    else printf("ncclCommSplit absent\n");
    if ((f = dlsym(RTLD_DEFAULT, "ncclCommInitRankConfig")))
      report("ncclCommInitRankConfig", ((int (*)(ncclComm_t *, int, ncclUniqueId, int, void *))f)(&other, 1, id, 0, NULL));
    else printf("ncclCommInitRankConfig absent\n");
    if ((f = dlsym(RTLD_DEFAULT, "ncclCommInitRankScalable")))
      report("ncclCommInitRankScalable", ((int (*)(ncclComm_t *, int, int, int, ncclUniqueId *, void *))f)(&other, 1, 0, 1, &id, NULL));
    else printf("ncclCommInitRankScalable absent\n");
    int async_error = -1;
    if ((f = dlsym(RTLD_DEFAULT, "ncclCommGetAsyncError")))
      report("ncclCommGetAsyncError", ((int (*)(ncclComm_t, int *))f)(c, &async_error));
    else printf("ncclCommGetAsyncError absent\n");
    if ((f = dlsym(RTLD_DEFAULT, "ncclCommAbort")))
      report("ncclCommAbort", ((int (*)(ncclComm_t))f)(c));
    else printf("ncclCommAbort absent\n");
  }
  /* The communicator is untouched: the core calls still reach NCCL. */
  CHECK(ncclAllReduce(NULL, NULL, 8, 7, 0, c, NULL));
  CHECK(ncclAllReduce(NULL, NULL, big, 7, 0, c, NULL));
  CHECK(ncclGroupStart());
  CHECK(ncclBroadcast(NULL, NULL, big, 7, 0, c, NULL));
  CHECK(ncclGroupEnd());
  CHECK(ncclCommDestroy(c));
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  int rc = strcmp(argv[1], "core") == 0 ? core() : strcmp(argv[1], "missing") == 0 ? missing() : 2;
  printf("----- fake nccl log\n%s", fake_log());
  return rc;
}
