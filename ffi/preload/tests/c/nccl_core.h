/* The NCCL entry points every NCCL 2.x exports, as the test programs call them (types reduced
 * to what the stand-in needs), and the programs' CHECK macro. */
#include <stddef.h>
#include <stdio.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef void *ncclComm_t;
int ncclGetUniqueId(ncclUniqueId *);
const char *ncclGetErrorString(int);
int ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int);
int ncclCommInitAll(ncclComm_t *, int, const int *);
int ncclCommDestroy(ncclComm_t);
int ncclGroupStart(void);
int ncclGroupEnd(void);
int ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, void *);
int ncclAllGather(const void *, void *, size_t, int, ncclComm_t, void *);
int ncclReduceScatter(const void *, void *, size_t, int, int, ncclComm_t, void *);
int ncclBroadcast(const void *, void *, size_t, int, int, ncclComm_t, void *);
int ncclReduce(const void *, void *, size_t, int, int, int, ncclComm_t, void *);

#define CHECK(x) do { int r_ = (x); if (r_) { printf("FAIL %s = %d\n", #x, r_); return 1; } } while (0)

/* Each of the five collectives once on `c`, `n` floats (the stand-in moves no data). */
static inline int each_collective(ncclComm_t c, size_t n) {
  CHECK(ncclAllReduce(NULL, NULL, n, 7, 0, c, NULL));
  CHECK(ncclAllGather(NULL, NULL, n, 7, c, NULL));
  CHECK(ncclReduceScatter(NULL, NULL, n, 7, 0, c, NULL));
  CHECK(ncclBroadcast(NULL, NULL, n, 7, 0, c, NULL));
  CHECK(ncclReduce(NULL, NULL, n, 7, 0, 0, c, NULL));
  return 0;
}
