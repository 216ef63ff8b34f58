/* A fake libnccl.so.2 for the interposer's CPU tests: every entry point records its call in a
 * log (readable through fake_log()) and succeeds without touching any buffer. Like NCCL, the
 * strong symbols are pnccl* and nccl* are weak aliases, and ncclCommInitAll calls the public
 * ncclGroupStart/ncclCommInitRank/ncclGroupEnd (through the PLT, so an interposer sees them).
 *
 * Built with -DFAKE_NCCL_CORE it is an older NCCL: it exports only the entry points of NCCL 2.x
 * before 2.4 (no ncclCommAbort / ncclCommGetAsyncError (2.4), ncclSend / ncclRecv (2.7),
 * ncclCommInitRankConfig (2.14), ncclCommSplit (2.18), ncclCommInitRankScalable (2.23)). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct fake_comm { int rank, nranks, dev; } *ncclComm_t;
typedef void *cudaStream_t;

static char log_buf[1 << 16];
static size_t log_len;

static void rec(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static void rec(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(log_buf + log_len, sizeof(log_buf) - log_len, fmt, ap);
  va_end(ap);
  if (n > 0 && log_len + (size_t)n + 1 < sizeof(log_buf)) {
    log_len += (size_t)n;
    log_buf[log_len++] = '\n';
    log_buf[log_len] = 0;
  }
}

const char *fake_log(void) { return log_buf; }
void fake_log_clear(void) { log_len = 0; log_buf[0] = 0; }

#define ALIAS(name) __attribute__((weak, alias("p" #name)))

/* Not wrapped by the interposer: the application reaches them directly. */
int pncclGetVersion(int *v) {
#ifdef FAKE_NCCL_CORE
  *v = 2304;
#else
  *v = 22703;
#endif
  return 0;
}
int ncclGetVersion(int *) ALIAS(ncclGetVersion);
/* An id unique to this process (parallel test processes must not meet in one domain). */
int pncclGetUniqueId(ncclUniqueId *id) {
  memset(id, 9, sizeof *id);
  snprintf(id->internal, sizeof id->internal, "fake-%d", (int)getpid());
  return 0;
}
int ncclGetUniqueId(ncclUniqueId *) ALIAS(ncclGetUniqueId);
const char *pncclGetErrorString(int r) {
  static const char *s[] = {"no error", "unhandled cuda error", "unhandled system error",
                            "internal error", "invalid argument", "invalid usage",
                            "remote process exited or there was a network error", "in progress"};
  return r >= 0 && r < (int)(sizeof s / sizeof *s) ? s[r] : "unknown result code";
}
const char *ncclGetErrorString(int) ALIAS(ncclGetErrorString);

static ncclComm_t mk(int rank, int nranks, int dev) {
  ncclComm_t c = calloc(1, sizeof(*c));
  c->rank = rank; c->nranks = nranks; c->dev = dev;
  return c;
}

int pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
  (void)id; *comm = mk(rank, nranks, rank); rec("CommInitRank %d/%d", rank, nranks); return 0;
}
int ncclCommInitRank(ncclComm_t *, int, ncclUniqueId, int) ALIAS(ncclCommInitRank);

#ifndef FAKE_NCCL_CORE
int pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, void *cfg) {
  (void)id; (void)cfg; *comm = mk(rank, nranks, rank); rec("CommInitRankConfig %d/%d", rank, nranks); return 0;
}
int ncclCommInitRankConfig(ncclComm_t *, int, ncclUniqueId, int, void *) ALIAS(ncclCommInitRankConfig);

int pncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nid, ncclUniqueId *ids, void *cfg) {
  (void)nid; (void)ids; (void)cfg; *comm = mk(rank, nranks, rank); rec("CommInitRankScalable %d/%d", rank, nranks); return 0;
}
int ncclCommInitRankScalable(ncclComm_t *, int, int, int, ncclUniqueId *, void *) ALIAS(ncclCommInitRankScalable);
#endif

int ncclGroupStart(void);
int ncclGroupEnd(void);
int pncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  (void)devlist;
  rec("CommInitAll %d", ndev);
  ncclUniqueId id; memset(&id, 7, sizeof id);
  ncclGroupStart();
  for (int i = 0; i < ndev; i++) ncclCommInitRank(&comms[i], ndev, id, i);
  ncclGroupEnd();
  return 0;
}
int ncclCommInitAll(ncclComm_t *, int, const int *) ALIAS(ncclCommInitAll);

#ifndef FAKE_NCCL_CORE
int pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, void *cfg) {
  (void)key; (void)cfg;
  *newcomm = color < 0 ? NULL : mk(0, 1, comm->dev);
  rec("CommSplit color=%d", color); return 0;
}
int ncclCommSplit(ncclComm_t, int, int, ncclComm_t *, void *) ALIAS(ncclCommSplit);
#endif

int pncclCommDestroy(ncclComm_t comm) { rec("CommDestroy rank=%d", comm->rank); free(comm); return 0; }
int ncclCommDestroy(ncclComm_t) ALIAS(ncclCommDestroy);
#ifndef FAKE_NCCL_CORE
int pncclCommAbort(ncclComm_t comm) { rec("CommAbort rank=%d", comm->rank); free(comm); return 0; }
int ncclCommAbort(ncclComm_t) ALIAS(ncclCommAbort);
int pncclCommGetAsyncError(ncclComm_t comm, int *e) { rec("CommGetAsyncError rank=%d", comm->rank); *e = 0; return 0; }
int ncclCommGetAsyncError(ncclComm_t, int *) ALIAS(ncclCommGetAsyncError);
#endif
int pncclCommCuDevice(ncclComm_t comm, int *dev) { *dev = comm->dev; return 0; }
int ncclCommCuDevice(ncclComm_t, int *) ALIAS(ncclCommCuDevice);
int pncclCommUserRank(ncclComm_t comm, int *r) { *r = comm->rank; return 0; }
int ncclCommUserRank(ncclComm_t, int *) ALIAS(ncclCommUserRank);
int pncclCommCount(ncclComm_t comm, int *n) { *n = comm->nranks; return 0; }
int ncclCommCount(ncclComm_t, int *) ALIAS(ncclCommCount);

static int depth;
int pncclGroupStart(void) { depth++; rec("GroupStart depth=%d", depth); return 0; }
int ncclGroupStart(void) ALIAS(ncclGroupStart);
int pncclGroupEnd(void) { rec("GroupEnd depth=%d", depth); depth--; return 0; }
int ncclGroupEnd(void) ALIAS(ncclGroupEnd);

int pncclAllReduce(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, cudaStream_t st) {
  (void)s; (void)r; (void)st; rec("AllReduce count=%zu dt=%d op=%d rank=%d", n, dt, op, c->rank); return 0;
}
int ncclAllReduce(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t) ALIAS(ncclAllReduce);
int pncclAllGather(const void *s, void *r, size_t n, int dt, ncclComm_t c, cudaStream_t st) {
  (void)s; (void)r; (void)st; rec("AllGather count=%zu dt=%d rank=%d", n, dt, c->rank); return 0;
}
int ncclAllGather(const void *, void *, size_t, int, ncclComm_t, cudaStream_t) ALIAS(ncclAllGather);
int pncclReduceScatter(const void *s, void *r, size_t n, int dt, int op, ncclComm_t c, cudaStream_t st) {
  (void)s; (void)r; (void)st; rec("ReduceScatter count=%zu dt=%d op=%d rank=%d", n, dt, op, c->rank); return 0;
}
int ncclReduceScatter(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t) ALIAS(ncclReduceScatter);
int pncclBroadcast(const void *s, void *r, size_t n, int dt, int root, ncclComm_t c, cudaStream_t st) {
  (void)s; (void)r; (void)st; rec("Broadcast count=%zu dt=%d root=%d rank=%d", n, dt, root, c->rank); return 0;
}
int ncclBroadcast(const void *, void *, size_t, int, int, ncclComm_t, cudaStream_t) ALIAS(ncclBroadcast);
int pncclReduce(const void *s, void *r, size_t n, int dt, int op, int root, ncclComm_t c, cudaStream_t st) {
  (void)s; (void)r; (void)st; rec("Reduce count=%zu dt=%d op=%d root=%d rank=%d", n, dt, op, root, c->rank); return 0;
}
int ncclReduce(const void *, void *, size_t, int, int, int, ncclComm_t, cudaStream_t) ALIAS(ncclReduce);
#ifndef FAKE_NCCL_CORE
int pncclSend(const void *s, size_t n, int dt, int peer, ncclComm_t c, cudaStream_t st) {
  (void)s; (void)st; rec("Send count=%zu dt=%d peer=%d rank=%d", n, dt, peer, c->rank); return 0;
}
int ncclSend(const void *, size_t, int, int, ncclComm_t, cudaStream_t) ALIAS(ncclSend);
int pncclRecv(void *r, size_t n, int dt, int peer, ncclComm_t c, cudaStream_t st) {
  (void)r; (void)st; rec("Recv count=%zu dt=%d peer=%d rank=%d", n, dt, peer, c->rank); return 0;
}
int ncclRecv(void *, size_t, int, int, ncclComm_t, cudaStream_t) ALIAS(ncclRecv);
#endif
