/* Two builds of one program that runs user_run() and prints the fake NCCL's call log:
 *  - direct (linked with user.c and libnccl.so.2): NCCL in the global scope;
 *    `client bench N` prints the nanoseconds per call instead;
 *  - -DLOCAL (linked with neither): opens libuser.so (argv[1]) RTLD_LOCAL, so libnccl.so.2 is
 *    loaded only as its dependency, outside the global scope — as Python loads PyTorch. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LOCAL
int main(int argc, char **argv) {
  if (argc < 2) return 2;
  void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!h) { printf("dlopen: %s\n", dlerror()); return 2; }
  int (*run)(void) = (int (*)(void))dlsym(h, "user_run");
  const char *(*log)(void) = (const char *(*)(void))dlsym(h, "fake_log");
  if (!run || !log) { printf("dlsym: %s\n", dlerror()); return 2; }
  int rc = run();
  printf("----- fake nccl log\n%s", log());
  return rc;
}
#else
int user_run(void);
double user_ns_per_call(long n);
const char *fake_log(void);

int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "bench") == 0) {
    printf("ns_per_call %.1f\n", user_ns_per_call(atol(argv[2])));
    return 0;
  }
  int rc = user_run();
  printf("----- fake nccl log\n%s", fake_log());
  return rc;
}
#endif
