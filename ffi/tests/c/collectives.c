/* One rank of the C ABI test (launched by ffi/tests/c_client.rs as 2, 3 and 4 processes with
 * AMPCCL_UNIQUE_ID (hex), RANK and WORLD_SIZE): every collective on a sample of types and
 * reductions, in place and out of place, counts 0/1/primes; grouped send/recv; streams and
 * events; split; abort + destroy; the error codes and messages; the public types' sizes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ampccl.h"

static int rank, world;

#define CHECK(cmd)                                                                          \
  do {                                                                                      \
    ampcclResult_t r_ = (cmd);                                                              \
    if (r_ != ampcclSuccess) {                                                              \
      fprintf(stderr, "rank %d: %s:%d: %s -> %d (%s): %s\n", rank, __FILE__, __LINE__, #cmd, \
              (int)r_, ampcclGetErrorString(r_), ampcclGetLastError(NULL));                 \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)
#define EXPECT(c)                                                                 \
  do {                                                                            \
    if (!(c)) {                                                                   \
      fprintf(stderr, "rank %d: %s:%d: expected %s\n", rank, __FILE__, __LINE__, #c); \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

static size_t dsize(ampcclDataType_t t) {
  switch (t) {
    case ampcclInt8: case ampcclUint8: return 1;
    case ampcclInt32: case ampcclUint32: case ampcclFloat32: return 4;
    default: return 8;
  }
}
static void set(void *b, ampcclDataType_t t, size_t i, double v) {
  switch (t) {
    case ampcclInt8: ((int8_t *)b)[i] = (int8_t)v; break;
    case ampcclUint8: ((uint8_t *)b)[i] = (uint8_t)v; break;
    case ampcclInt32: ((int32_t *)b)[i] = (int32_t)v; break;
    case ampcclUint32: ((uint32_t *)b)[i] = (uint32_t)v; break;
    case ampcclInt64: ((int64_t *)b)[i] = (int64_t)v; break;
    case ampcclUint64: ((uint64_t *)b)[i] = (uint64_t)v; break;
    case ampcclFloat32: ((float *)b)[i] = (float)v; break;
    default: ((double *)b)[i] = v; break;
  }
}
static double get(const void *b, ampcclDataType_t t, size_t i) {
  switch (t) {
    case ampcclInt8: return ((const int8_t *)b)[i];
    case ampcclUint8: return ((const uint8_t *)b)[i];
    case ampcclInt32: return ((const int32_t *)b)[i];
    case ampcclUint32: return ((const uint32_t *)b)[i];
    case ampcclInt64: return (double)((const int64_t *)b)[i];
    case ampcclUint64: return (double)((const uint64_t *)b)[i];
    case ampcclFloat32: return ((const float *)b)[i];
    default: return ((const double *)b)[i];
  }
}
/* Input of rank r at index i for reduction op (products stay small: factors 1 and 2). */
static double in(int op, int r, size_t i) {
  return op == ampcclProd ? 1 + (double)((r + i) % 2) : (double)(r + 1) + (double)(i % 7);
}
static double want(int op, size_t i) {
  double acc = in(op, 0, i);
  for (int r = 1; r < world; r++) {
    double v = in(op, r, i);
    if (op == ampcclSum || op == ampcclAvg) acc += v;
    if (op == ampcclProd) acc *= v;
    if (op == ampcclMax) acc = v > acc ? v : acc;
    if (op == ampcclMin) acc = v < acc ? v : acc;
  }
  return op == ampcclAvg ? acc / world : acc;
}
static void near(double got, double w, const char *what, size_t i) {
  double d = got - w;
  if (d < 0) d = -d;
  if (d > 1e-3 * (w < 0 ? -w : w) + 1e-9) {
    fprintf(stderr, "rank %d: %s[%zu] = %g, want %g\n", rank, what, i, got, w);
    exit(1);
  }
}

static void allreduce(ampcclComm_t c, ampcclStream_t s, ampcclDataType_t t, int op, size_t n) {
  char *a = malloc(n * dsize(t) + 8), *b = malloc(n * dsize(t) + 8);
  for (size_t i = 0; i < n; i++) set(a, t, i, in(op, rank, i));
  CHECK(ampcclAllReduce(a, b, n, t, op, c, s)); /* out of place */
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n; i++) near(get(b, t, i), want(op, i), "allreduce", i);
  CHECK(ampcclAllReduce(a, a, n, t, op, c, s)); /* in place */
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n; i++) near(get(a, t, i), want(op, i), "allreduce in place", i);
  free(a), free(b);
}

/* Zeroed int32 buffer: from ampcclMemAlloc (shared user memory, which peers write and read
 * directly) or from calloc. */
static int32_t *alloc_i32(size_t count, int shared) {
  if (!shared) return calloc(count, 4);
  void *p = NULL;
  CHECK(ampcclMemAlloc(&p, count * 4));
  return p;
}

static void release(int32_t *p, int shared) {
  if (shared) {
    CHECK(ampcclMemFree(p));
  } else {
    free(p);
  }
}

static void collectives(ampcclComm_t c, ampcclStream_t s, size_t n, int shared) {
  ampcclDataType_t all[] = {ampcclInt8, ampcclUint8, ampcclInt32, ampcclUint32,
                            ampcclInt64, ampcclUint64, ampcclFloat32, ampcclFloat64};
  for (int k = 0; k < 8; k++) allreduce(c, s, all[k], ampcclSum, n);
  for (int op = ampcclProd; op <= ampcclAvg; op++) allreduce(c, s, ampcclFloat32, op, n);
  allreduce(c, s, ampcclInt32, ampcclMax, n);
  allreduce(c, s, ampcclInt64, ampcclMin, n);
  allreduce(c, s, ampcclFloat64, ampcclAvg, n);

  size_t W = (size_t)world, N = n * W + 1;
  int32_t *x = alloc_i32(N, shared), *y = alloc_i32(N, shared);
  /* allgather, out of place then in place (input = output + rank * n) */
  for (size_t i = 0; i < n; i++) x[i] = rank * 1000 + (int32_t)i;
  CHECK(ampcclAllGather(x, y, n, ampcclInt32, c, s));
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n * W; i++) EXPECT(y[i] == (int32_t)((i / n) * 1000 + i % n));
  memset(y, 0, N * 4);
  for (size_t i = 0; i < n; i++) y[rank * n + i] = rank * 1000 + (int32_t)i;
  CHECK(ampcclAllGather(y + rank * n, y, n, ampcclInt32, c, s));
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n * W; i++) EXPECT(y[i] == (int32_t)((i / n) * 1000 + i % n));
  /* reduce-scatter (sum): block b of rank r holds r + b * 10 + i */
  for (size_t i = 0; i < n * W; i++) x[i] = rank + (int32_t)((i / (n ? n : 1)) * 10 + i % (n ? n : 1));
  CHECK(ampcclReduceScatter(x, y, n, ampcclInt32, ampcclSum, c, s));
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n; i++) EXPECT(y[i] == world * (world - 1) / 2 + world * (rank * 10 + (int32_t)i));
  CHECK(ampcclReduceScatter(x, x + rank * n, n, ampcclInt32, ampcclSum, c, s));
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n; i++) EXPECT(x[rank * n + i] == world * (world - 1) / 2 + world * (rank * 10 + (int32_t)i));
  /* broadcast from the last rank, out of place and in place */
  int root = world - 1;
  for (size_t i = 0; i < n; i++) x[i] = rank == root ? 7 * (int32_t)i : -1, y[i] = -2;
  CHECK(ampcclBroadcast(x, y, n, ampcclInt32, root, c, s));
  CHECK(ampcclBroadcast(x, x, n, ampcclInt32, root, c, s));
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n; i++) EXPECT(y[i] == 7 * (int32_t)i && x[i] == 7 * (int32_t)i);
  /* reduce (max) to rank 1 % world, out of place and in place */
  root = 1 % world;
  for (size_t i = 0; i < n; i++) x[i] = rank + (int32_t)i, y[i] = -1;
  CHECK(ampcclReduce(x, y, n, ampcclInt32, ampcclMax, root, c, s));
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n; i++) EXPECT(y[i] == (rank == root ? world - 1 + (int32_t)i : -1));
  CHECK(ampcclReduce(x, x, n, ampcclInt32, ampcclMax, root, c, s));
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n; i++) EXPECT(x[i] == (rank == root ? world - 1 : rank) + (int32_t)i);
  /* all-to-all: block j of rank r = r * 100 + j */
  for (size_t i = 0; i < n * W; i++) x[i] = rank * 100 + (int32_t)(i / n);
  CHECK(ampcclAlltoAll(x, y, n, ampcclInt32, c, s));
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n * W; i++) EXPECT(y[i] == (int32_t)(i / n) * 100 + rank);
  /* ring send/recv in a (nested) group */
  int next = (rank + 1) % world, prev = (rank + world - 1) % world;
  for (size_t i = 0; i < n; i++) x[i] = rank * 10 + (int32_t)i, y[i] = -1;
  CHECK(ampcclGroupStart());
  CHECK(ampcclSend(x, n, ampcclInt32, next, c, s));
  CHECK(ampcclGroupStart());
  CHECK(ampcclRecv(y, n, ampcclInt32, prev, c, s));
  CHECK(ampcclGroupEnd());
  CHECK(ampcclGroupEnd());
  CHECK(ampcclStreamSynchronize(s));
  for (size_t i = 0; i < n; i++) EXPECT(y[i] == prev * 10 + (int32_t)i);
  release(x, shared), release(y, shared);
}

static void expect_err(ampcclResult_t got, ampcclResult_t want, const char *needle) {
  const char *msg = ampcclGetLastError(NULL);
  if (got != want || strstr(msg, needle) == NULL) {
    fprintf(stderr, "rank %d: got %d, want %d; last error %s (wanted '%s' in it)\n", rank, (int)got,
            (int)want, msg, needle);
    exit(1);
  }
}

static void errors(ampcclComm_t c, ampcclStream_t s) {
  float f[4] = {0};
  expect_err(ampcclAllReduce(NULL, f, 4, ampcclFloat32, ampcclSum, c, s), ampcclInvalidArgument, "null");
  expect_err(ampcclAllReduce(f, f, 4, (ampcclDataType_t)99, ampcclSum, c, s), ampcclInvalidArgument, "datatype 99");
  expect_err(ampcclAllReduce(f, f, 4, ampcclFloat32, (ampcclRedOp_t)7, c, s), ampcclInvalidArgument, "reduction 7");
  expect_err(ampcclBroadcast(f, f, 4, ampcclFloat32, world, c, s), ampcclInvalidArgument, "root");
  expect_err(ampcclSend(f, 4, ampcclFloat32, -1, c, s), ampcclInvalidArgument, "peer -1");
  expect_err(ampcclAllReduce(f, f, 4, ampcclFloat32, ampcclSum, NULL, s), ampcclInvalidArgument, "comm is NULL");
  expect_err(ampcclCommDestroy(NULL), ampcclInvalidArgument, "NULL");
  expect_err(ampcclStreamSynchronize(NULL), ampcclInvalidArgument, "ampcclCommSynchronize");
  expect_err(ampcclGroupEnd(), ampcclInvalidUsage, "GroupStart");
  ampcclConfig_t bad = AMPCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  ampcclComm_t nc;
  ampcclUniqueId id;
  memset(&id, 0, sizeof id);
  expect_err(ampcclCommInitRankConfig(&nc, 2, id, 0, &bad), ampcclInvalidArgument, "magic");
  expect_err(ampcclCommInitRank(&nc, 2, id, 0), ampcclInvalidArgument, "unique id");
  void *p = NULL;
  expect_err(ampcclMemAlloc(NULL, 8), ampcclInvalidArgument, "NULL");
  expect_err(ampcclMemAlloc(&p, 0), ampcclInvalidArgument, "size is 0");
  expect_err(ampcclMemFree(f), ampcclInvalidArgument, "not allocated by ampcclMemAlloc");
  CHECK(ampcclMemFree(NULL));
  EXPECT(strcmp(ampcclGetErrorString(ampcclSuccess), "no error") == 0);
  EXPECT(strstr(ampcclGetErrorString(ampcclInvalidArgument), "invalid argument") != NULL);
  EXPECT(strstr(ampcclGetErrorString((ampcclResult_t)99), "unknown") != NULL);
}

int main(void) {
  EXPECT(sizeof(ampcclUniqueId) == 128 && AMPCCL_UNIQUE_ID_BYTES == 128);
  EXPECT(sizeof(ampcclConfig_t) == 40 && sizeof(ampcclResult_t) == 4);
  EXPECT(ampcclInProgress == 7 && ampcclRemoteError == 6 && ampcclBfloat16 == 9 && ampcclAvg == 4);
  const char *hex = getenv("AMPCCL_UNIQUE_ID"), *r = getenv("RANK"), *w = getenv("WORLD_SIZE");
  EXPECT(hex && r && w);
  rank = atoi(r), world = atoi(w);
  int v = 0;
  CHECK(ampcclGetVersion(&v));
  EXPECT(v == AMPCCL_VERSION_CODE);
  ampcclUniqueId id;
  CHECK(ampcclUniqueIdFromString(hex, &id));
  char back[2 * AMPCCL_UNIQUE_ID_BYTES + 1];
  CHECK(ampcclUniqueIdToString(&id, back, sizeof back));
  EXPECT(strcmp(back, hex) == 0);

  ampcclComm_t comm;
  CHECK(ampcclCommInitRank(&comm, world, id, rank));
  int n = 0, me = -1;
  CHECK(ampcclCommCount(comm, &n));
  CHECK(ampcclCommUserRank(comm, &me));
  EXPECT(n == world && me == rank);

  ampcclStream_t s, s2;
  CHECK(ampcclStreamCreate(&s));
  CHECK(ampcclStreamCreate(&s2));
  size_t counts[] = {0, 1, 13, 1031};
  for (int k = 0; k < 4; k++) collectives(comm, s, counts[k], 0);
  /* Shared buffers: a broadcast of 300001 int32 takes the pair's pushes and pulls. */
  collectives(comm, s, 1031, 1);
  collectives(comm, s, 300001, 1);
  errors(comm, s);

  /* NULL stream + ampcclCommSynchronize; events across two streams */
  double d[64], e[64];
  for (int i = 0; i < 64; i++) d[i] = rank + i;
  CHECK(ampcclAllReduce(d, d, 64, ampcclFloat64, ampcclSum, comm, NULL));
  CHECK(ampcclCommSynchronize(comm));
  for (int i = 0; i < 64; i++) EXPECT(d[i] == world * (world - 1) / 2.0 + world * i);
  ampcclEvent_t ev;
  CHECK(ampcclEventCreate(&ev));
  CHECK(ampcclAllReduce(d, e, 64, ampcclFloat64, ampcclMax, comm, s));
  CHECK(ampcclEventRecord(ev, s));
  CHECK(ampcclStreamWaitEvent(s2, ev));
  CHECK(ampcclAllReduce(e, e, 64, ampcclFloat64, ampcclSum, comm, s2));
  CHECK(ampcclEventSynchronize(ev));
  CHECK(ampcclEventQuery(ev));
  CHECK(ampcclStreamSynchronize(s2));
  CHECK(ampcclStreamQuery(s2));
  CHECK(ampcclStreamQuery(s));
  for (int i = 0; i < 64; i++) EXPECT(e[i] == world * d[i]);
  ampcclResult_t async;
  CHECK(ampcclCommGetAsyncError(comm, &async));
  EXPECT(async == ampcclSuccess);

  /* split: even/odd ranks; the last of 3+ ranks joins none */
  int color = (world > 2 && rank == world - 1) ? AMPCCL_SPLIT_NOCOLOR : rank % 2;
  ampcclComm_t sub;
  CHECK(ampcclCommSplit(comm, color, -rank, &sub, NULL));
  if (color == AMPCCL_SPLIT_NOCOLOR) {
    EXPECT(sub == NULL);
  } else {
    int sn, sr;
    CHECK(ampcclCommCount(sub, &sn));
    CHECK(ampcclCommUserRank(sub, &sr));
    int32_t one = 1;
    CHECK(ampcclAllReduce(&one, &one, 1, ampcclInt32, ampcclSum, sub, s));
    CHECK(ampcclStreamSynchronize(s));
    EXPECT(one == sn);
  }
  /* Every rank is past the sub-communicators' work once this completes: aborting is quiet. */
  int32_t all = 1;
  CHECK(ampcclAllReduce(&all, &all, 1, ampcclInt32, ampcclSum, comm, s));
  CHECK(ampcclStreamSynchronize(s));
  EXPECT(all == world);
  if (sub != NULL) {
    CHECK(ampcclCommAbort(sub));
    CHECK(ampcclCommGetAsyncError(sub, &async));
    EXPECT(async == ampcclRemoteError);
    CHECK(ampcclCommDestroy(sub)); /* destroy after abort is safe */
  }
  CHECK(ampcclEventDestroy(ev));
  CHECK(ampcclStreamDestroy(s));
  CHECK(ampcclStreamDestroy(s2));
  CHECK(ampcclCommDestroy(comm));
  printf("rank %d of %d: C client passed\n", rank, world);
  return 0;
}
