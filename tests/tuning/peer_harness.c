/*
 * Drives the plugin's per-peer timing (CCLC_PEER_TIMINGS) with the events NCCL's profiler
 * emits for proxy operations, the way NCCL calls them:
 *
 *   peer_harness PLUGIN.so PREFIX
 *
 * One communicator (rank 1 of 4): an AllReduce event, then per peer 0, 2, 3 a send and a
 * receive proxy operation with two proxy steps each; the send to peer 2 is held open longer
 * (a slow link). A PXN proxy operation run for another process carries a parent pointer that
 * must not be read. The descriptor layout is declared here independently of the plugin (from
 * NCCL's profiler_v5.h). Exit status 0 when every check passes; the JSON is checked in Python.
 */
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

typedef int ncclResult_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

#include "profiler_v5.h"

enum { COLL = 1 << 1, PROXY_OP = 1 << 3, PROXY_STEP = 1 << 4, SEND_WAIT = 9, RECV_WAIT = 10 };

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
  fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

static void quiet_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)level; (void)flags; (void)file; (void)line; (void)fmt;
}

static void sleep_ms(int ms) {
  struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
  nanosleep(&ts, NULL);
}

/* one proxy operation of `steps` steps of `size` bytes, held open `ms` milliseconds */
static void proxy_op(const profiler_v5* pv, void* ctx, void* parent, pid_t pid, int peer,
                     int isSend, int steps, size_t size, int ms) {
  descr_v5 d;
  memset(&d, 0, sizeof(d));
  d.type = PROXY_OP; d.parentObj = parent; d.rank = 1;
  d.proxyOp.pid = pid; d.proxyOp.peer = peer; d.proxyOp.nSteps = steps;
  d.proxyOp.chunkSize = (int)size; d.proxyOp.isSend = isSend;
  void* op = NULL;
  CHECK(pv->startEvent(ctx, &op, &d) == 0, "start proxy op");
  CHECK(op != NULL, "no handle for a proxy op");
  for (int s = 0; s < steps; s++) {
    descr_v5 st;
    memset(&st, 0, sizeof(st));
    st.type = PROXY_STEP; st.parentObj = op; st.rank = 1; st.proxyStep.step = s;
    void* h = NULL;
    CHECK(pv->startEvent(ctx, &h, &st) == 0, "start proxy step");
    state_args_v5 a;
    a.proxyStep.transSize = size;
    CHECK(pv->recordEventState(h, isSend ? SEND_WAIT : RECV_WAIT, &a) == 0, "record step");
    CHECK(pv->stopEvent(h) == 0, "stop proxy step");
  }
  sleep_ms(ms);
  CHECK(pv->stopEvent(op) == 0, "stop proxy op");
}

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s PLUGIN.so PREFIX\n", argv[0]); return 2; }
  setenv("CCLC_PEER_TIMINGS", argv[2], 1);
  setenv("CCLC_PEER_TIMINGS_EVERY", "4", 1);
  void* lib = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
  if (lib == NULL) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  const profiler_v5* pv = (const profiler_v5*)dlsym(lib, "ncclProfiler_v6");
  if (pv == NULL) { fprintf(stderr, "no ncclProfiler_v6\n"); return 1; }
  void* ctx = NULL;
  int mask = 0;
  const uint64_t id = 0xabcdef;
  CHECK(pv->init(&ctx, id, &mask, "diag", 1, 4, 1, quiet_logger) == 0, "profiler init");
  CHECK((mask & COLL) && (mask & PROXY_OP) && (mask & PROXY_STEP),
        "activation mask %#x lacks Coll|ProxyOp|ProxyStep", mask);

  descr_v5 c;
  memset(&c, 0, sizeof(c));
  c.type = COLL; c.rank = 1;
  c.coll.func = "AllReduce"; c.coll.count = 1 << 20; c.coll.datatype = "ncclFloat32";
  c.coll.nChannels = 2; c.coll.algo = "Ring"; c.coll.proto = "Simple";
  void* coll = NULL;
  CHECK(pv->startEvent(ctx, &coll, &c) == 0 && coll != NULL, "start coll");
  pid_t me = getpid();
  for (int peer = 0; peer < 4; peer++) {
    if (peer == 1) continue;
    proxy_op(pv, ctx, coll, me, peer, 1, 2, 65536, peer == 2 ? 40 : 4);
    proxy_op(pv, ctx, coll, me, peer, 0, 2, 65536, 4);
  }
  CHECK(pv->stopEvent(coll) == 0, "stop coll");
  char path[4200];
  snprintf(path, sizeof(path), "%s.%016llx.rank1.json", argv[2], (unsigned long long)id);
  CHECK(access(path, R_OK) == 0, "CCLC_PEER_TIMINGS_EVERY=4 wrote no file before finalize");
  /* a PXN op run for another process: its parent must not be dereferenced */
  proxy_op(pv, ctx, (void*)(uintptr_t)0x10, me + 1, 3, 1, 1, 4096, 1);
  /* a peer outside the communicator is ignored */
  descr_v5 bad;
  memset(&bad, 0, sizeof(bad));
  bad.type = PROXY_OP; bad.rank = 1; bad.proxyOp.pid = me; bad.proxyOp.peer = 9;
  void* h = (void*)1;
  CHECK(pv->startEvent(ctx, &h, &bad) == 0 && h == NULL, "peer 9 of 4 got a handle");
  CHECK(pv->finalize(ctx) == 0, "finalize");
  printf("peer timings: %d failures\n", failures);
  dlclose(lib);
  return failures ? 1 : 0;
}
