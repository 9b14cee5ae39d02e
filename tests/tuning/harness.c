/*
 * Loads a tuner plugin the way NCCL does and checks what it does to NCCL's decisions.
 *
 *   harness PLUGIN.so ROWS.txt   static checks against the rows the plugin was built from
 *   harness PLUGIN.so --online   online tuning driven by synthetic profiler events
 *   harness PLUGIN.so --threads  the online run on 4 communicators from 4 threads at once
 *
 * ROWS.txt: one row per line, "func nRanks nNodes minBytes maxBytes algo proto channels chunk".
 * The ABI structs are declared here independently of the plugin (from NCCL's tuner_v2..v6.h
 * and profiler_v5.h). Exit status 0 when every check passes; failures are printed.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef int ncclResult_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
#define NA 7
#define NP 3
#define IGNORE (-1.0f)

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t, size_t, logger_t, void**);
  ncclResult_t (*getCollInfo)(void*, int, size_t, int, int, int, int*, int*, int*);
  ncclResult_t (*destroy)(void*);
} tuner_v2;
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t, size_t, logger_t, void**);
  ncclResult_t (*getCollInfo)(void*, int, size_t, int, float**, int, int, int*);
  ncclResult_t (*destroy)(void*);
} tuner_v3;
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t, size_t, logger_t, void**);
  ncclResult_t (*getCollInfo)(void*, int, size_t, int, float**, int, int, int, int*);
  ncclResult_t (*destroy)(void*);
} tuner_v4;
typedef struct {
  const char* name;
  ncclResult_t (*init)(void**, uint64_t, size_t, size_t, logger_t, void*, void*);
  ncclResult_t (*getCollInfo)(void*, int, size_t, int, float**, int, int, int, int*);
  ncclResult_t (*finalize)(void*);
  ncclResult_t (*getChunkSize)(void*, int, size_t, int, int, int, size_t*);
} tuner_v6;   /* v5 is the same without getChunkSize */

#include "profiler_v5.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED); fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
  fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

/* formats every message (so a bad format string shows under the sanitizers), prints nothing */
static void quiet_logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  (void)level; (void)flags; (void)file; (void)line;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
}

typedef struct { int func; long long nRanks, nNodes; unsigned long long lo, hi; int algo, proto, ch; unsigned long long chunk; } row_t;

/* NCCL's table: a contiguous float[7][3] of estimated times, IGNORE where unavailable */
static void fill_table(float t[NA][NP], unsigned seed, int ignore_algo, int ignore_proto) {
  for (int a = 0; a < NA; a++)
    for (int p = 0; p < NP; p++) t[a][p] = 5.0f + (float)((seed * 7u + (unsigned)(a * NP + p) * 13u) % 97u);
  t[2][0] = t[2][1] = t[3][0] = t[3][1] = IGNORE;   /* CollNet only has Simple */
  t[6][0] = t[6][1] = IGNORE;                       /* PAT only has Simple */
  if (ignore_algo >= 0) t[ignore_algo][ignore_proto] = IGNORE;
}

static int same_except(float a[NA][NP], float b[NA][NP], int xa, int xp) {
  for (int i = 0; i < NA; i++)
    for (int j = 0; j < NP; j++)
      if (!(i == xa && j == xp) && memcmp(&a[i][j], &b[i][j], sizeof(float)) != 0) return 0;
  return 1;
}

static const row_t* match(const row_t* rows, int n, long long nr, long long nn, int func, unsigned long long bytes) {
  for (int i = 0; i < n; i++)
    if (rows[i].func == func && rows[i].nRanks == nr && rows[i].nNodes == nn && bytes >= rows[i].lo && bytes <= rows[i].hi)
      return &rows[i];
  return NULL;
}

static int run_static(void* lib, const char* rows_path) {
  /* NCCL's probe order: the first symbol found wins */
  const char* names[] = { "ncclTunerPlugin_v6", "ncclTunerPlugin_v5", "ncclTunerPlugin_v4",
                          "ncclTunerPlugin_v3", "ncclTunerPlugin_v2" };
  void* first = NULL;
  for (int i = 0; i < 5 && first == NULL; i++) {
    first = dlsym(lib, names[i]);
    CHECK(i == 0 || first == NULL, "v6 missing; NCCL 2.30+ would fall back to %s", names[i]);
  }
  for (int i = 0; i < 5; i++) CHECK(dlsym(lib, names[i]) != NULL, "%s not exported", names[i]);
  CHECK(dlsym(lib, "ncclProfiler_v6") != NULL && dlsym(lib, "ncclProfiler_v5") != NULL, "profiler symbols missing");
  const tuner_v6* v6 = (const tuner_v6*)first;
  const tuner_v6* v5 = (const tuner_v6*)dlsym(lib, "ncclTunerPlugin_v5");
  const tuner_v4* v4 = (const tuner_v4*)dlsym(lib, "ncclTunerPlugin_v4");
  const tuner_v3* v3 = (const tuner_v3*)dlsym(lib, "ncclTunerPlugin_v3");
  const tuner_v2* v2 = (const tuner_v2*)dlsym(lib, "ncclTunerPlugin_v2");
  if (!v6 || !v5 || !v4 || !v3 || !v2) return 1;
  CHECK(v6->name && strlen(v6->name) > 0, "v6 has no name");
  CHECK(v6->getChunkSize != NULL, "v6 getChunkSize is NULL");

  row_t rows[512];
  int n = 0;
  FILE* f = fopen(rows_path, "r");
  if (!f) { perror(rows_path); return 1; }
  while (n < 512 && fscanf(f, "%d %lld %lld %llu %llu %d %d %d %llu", &rows[n].func, &rows[n].nRanks,
                           &rows[n].nNodes, &rows[n].lo, &rows[n].hi, &rows[n].algo, &rows[n].proto,
                           &rows[n].ch, &rows[n].chunk) == 9) n++;
  fclose(f);

  /* one communicator per (nRanks, nNodes) in the table, plus one the table does not know;
   * all alive at once, and the calls below interleave between them */
  long long comms[16][2];
  int ncomm = 0;
  for (int i = 0; i < n; i++) {
    int seen = 0;
    for (int c = 0; c < ncomm; c++) seen |= comms[c][0] == rows[i].nRanks && comms[c][1] == rows[i].nNodes;
    if (!seen && ncomm < 15) { comms[ncomm][0] = rows[i].nRanks; comms[ncomm][1] = rows[i].nNodes; ncomm++; }
  }
  comms[ncomm][0] = 999; comms[ncomm][1] = 7; ncomm++;
  void* ctx6[16]; void* ctx5[16]; void* ctx4[16]; void* ctx3[16]; void* ctx2[16];
  for (int c = 0; c < ncomm; c++) {
    CHECK(v6->init(&ctx6[c], 1000 + (uint64_t)c, (size_t)comms[c][0], (size_t)comms[c][1], quiet_logger, NULL, NULL) == 0, "v6 init");
    CHECK(v5->init(&ctx5[c], 2000 + (uint64_t)c, (size_t)comms[c][0], (size_t)comms[c][1], quiet_logger, NULL, NULL) == 0, "v5 init");
    CHECK(v4->init((size_t)comms[c][0], (size_t)comms[c][1], quiet_logger, &ctx4[c]) == 0, "v4 init");
    CHECK(v3->init((size_t)comms[c][0], (size_t)comms[c][1], NULL, &ctx3[c]) == 0, "v3 init");
    CHECK(v2->init((size_t)comms[c][0], (size_t)comms[c][1], NULL, &ctx2[c]) == 0, "v2 init");
  }
  int checks = 0;
  for (int round = 0; round < 2; round++) {
    for (int c = 0; c < ncomm; c++) {
      for (int func = 0; func < 9; func++) {
        /* probe sizes: every row edge of this function (and one past it), plus fixed sizes */
        unsigned long long probes[64];
        int np = 0;
        for (int i = 0; i < n && np < 56; i++) {
          if (rows[i].func != func) continue;
          probes[np++] = rows[i].lo; probes[np++] = rows[i].hi;
          probes[np++] = rows[i].lo + (rows[i].hi - rows[i].lo) / 2;
          if (rows[i].lo > 0) probes[np++] = rows[i].lo - 1;
          probes[np++] = rows[i].hi + 1;
        }
        probes[np++] = 0; probes[np++] = 1; probes[np++] = 1ULL << 20; probes[np++] = 1ULL << 40;
        for (int k = 0; k < np; k++) {
          unsigned long long bytes = probes[k];
          const row_t* r = func < 5 ? match(rows, n, comms[c][0], comms[c][1], func, bytes) : NULL;
          for (int avail = 0; avail < 2; avail++) {
            float t[NA][NP], orig[NA][NP];
            /* avail==0: the row's choice is IGNORE in NCCL's table */
            fill_table(t, (unsigned)(k + c * 31 + func), (r && !avail) ? r->algo : -1, r ? r->proto : 0);
            memcpy(orig, t, sizeof(t));
            int nch = 0;
            void* ctx = round == 0 ? ctx6[c] : ctx5[c];
            const tuner_v6* tv = round == 0 ? v6 : v5;
            CHECK(tv->getCollInfo(ctx, func, (size_t)bytes, 1, (float**)t, NA, NP, 0, &nch) == 0, "getCollInfo failed");
            checks++;
            bool forced = r != NULL && orig[r->algo][r->proto] >= 0.0f;
            if (forced) {
              CHECK(t[r->algo][r->proto] == 0.0f, "comm %d func %d bytes %llu: entry [%d][%d] is %g, want 0",
                    c, func, bytes, r->algo, r->proto, t[r->algo][r->proto]);
              CHECK(same_except(t, orig, r->algo, r->proto), "comm %d func %d bytes %llu: other entries changed", c, func, bytes);
              CHECK(nch == r->ch, "comm %d func %d bytes %llu: nChannels %d, want %d", c, func, bytes, nch, r->ch);
            } else {
              CHECK(same_except(t, orig, -1, -1), "comm %d func %d bytes %llu (%s): table changed",
                    c, func, bytes, r ? "choice unavailable" : "not in the table");
              CHECK(nch == 0, "comm %d func %d bytes %llu: nChannels %d set outside the table", c, func, bytes, nch);
            }
            if (round == 0 && r != NULL) {
              size_t chunk = 1u << 21;
              CHECK(v6->getChunkSize(ctx6[c], func, (size_t)bytes, r->algo, r->proto, r->ch, &chunk) == 0, "getChunkSize");
              CHECK(chunk == (r->chunk ? r->chunk : (1u << 21)), "chunk %zu, want %llu", chunk, r->chunk);
              size_t other = 1u << 21;
              v6->getChunkSize(ctx6[c], func, (size_t)bytes, (r->algo + 1) % NA, r->proto, r->ch, &other);
              CHECK(other == (1u << 21), "chunk changed for an algorithm the table did not choose");
            }
            if (round == 1 && avail) {
              /* the v3/v4 entry points share the semantics; a 2.22-sized table has no PAT row */
              float t4[NA][NP], t3[NA - 1][NP];
              memcpy(t4, orig, sizeof(t4));
              memcpy(t3, orig, sizeof(t3));
              int n4 = 0, n3 = 0;
              v4->getCollInfo(ctx4[c], func, (size_t)bytes, 1, (float**)t4, NA, NP, 0, &n4);
              v3->getCollInfo(ctx3[c], func, (size_t)bytes, 1, (float**)t3, NA - 1, NP, &n3);
              CHECK(memcmp(t4, t, sizeof(t4)) == 0 && n4 == nch, "v4 differs from v5");
              if (r != NULL && r->algo < NA - 1 && orig[r->algo][r->proto] >= 0.0f)
                CHECK(t3[r->algo][r->proto] == 0.0f && n3 == r->ch, "v3 did not force the row");
              else
                CHECK(memcmp(t3, orig, sizeof(t3)) == 0 && n3 == 0, "v3 changed a 6-algorithm table");
              int algo = -1, proto = -1, n2 = 0;
              v2->getCollInfo(ctx2[c], func, (size_t)bytes, 0, 1, 1, &algo, &proto, &n2);
              if (r != NULL && (r->algo == 1 || (r->algo == 0 && func == 4) || r->algo == 4 || r->algo == 5))
                CHECK(algo == r->algo && proto == r->proto && n2 == r->ch, "v2 did not choose the row");
              else
                CHECK(algo == -1 && proto == -1 && n2 == 0, "v2 chose outside the table / unsupported");
            }
          }
        }
      }
    }
  }
  for (int c = 0; c < ncomm; c++) {
    CHECK(v6->finalize(ctx6[c]) == 0, "finalize");
    CHECK(v5->finalize(ctx5[c]) == 0, "finalize");
    v4->destroy(ctx4[c]); v3->destroy(ctx3[c]); v2->destroy(ctx2[c]);
  }
  printf("static: %d rows, %d communicators, %d getCollInfo checks, %d failures\n", n, ncomm, checks, failures);
  return failures != 0;
}

/* ---- online ---------------------------------------------------------------------------------- */
static const char* ALGO[NA] = { "Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT" };
static const char* PROTO[NP] = { "LL", "LL128", "Simple" };

/* Synthetic GPU time (ns): Ring/Simple is fastest although NCCL's estimate prefers Ring/LL128;
 * unimodal in channels (best 8) and in the chunk shift (best 2). */
static double synthetic_ns(int a, int p, int nch, int shift) {
  double base = 1e9;
  if (a == 1 && p == 2) base = 800e3;
  if (a == 1 && p == 1) base = 1000e3;
  if (a == 0 && p == 2) base = 1200e3;
  if (a == 1 && p == 0) base = 3000e3;
  if (a == 0 && p == 1) base = 2000e3;
  double d = log2((double)nch) - 3.0;
  return base * (1.0 + 0.1 * d * d) * (1.0 + 0.05 * (shift - 2) * (shift - 2));
}

static int run_online(void* lib, uint64_t id) {
  const tuner_v6* tv = (const tuner_v6*)dlsym(lib, "ncclTunerPlugin_v6");
  const profiler_v5* pv = (const profiler_v5*)dlsym(lib, "ncclProfiler_v6");
  if (!tv || !pv) { fprintf(stderr, "symbols missing\n"); return 1; }
  void *tctx = NULL, *pctx = NULL, *lonely = NULL;
  int mask = 0;
  /* profiler first, as NCCL may do; the commId joins the two contexts */
  CHECK(pv->init(&pctx, id, &mask, "test", 1, 3, 0, quiet_logger) == 0, "profiler init");
  CHECK((mask & (1 << 1)) && (mask & (1 << 6)), "activation mask %#x lacks Coll|KernelCh", mask);
  CHECK(tv->init(&tctx, id, 3, 1, quiet_logger, NULL, NULL) == 0, "tuner init");
  CHECK(tv->init(&lonely, id + 1, 3, 1, quiet_logger, NULL, NULL) == 0, "tuner init (no profiler)");
  const size_t bytes = 1u << 24;
  uint64_t clock = 1000000;
  int lastA = -1, lastP = -1, lastN = -1, lastS = -1, stable = 0, converged_at = -1;
  for (int it = 0; it < 3000; it++) {
    float t[NA][NP], orig[NA][NP];
    for (int a = 0; a < NA; a++) for (int p = 0; p < NP; p++) t[a][p] = IGNORE;
    t[1][0] = 50; t[1][1] = 20; t[1][2] = 25; t[0][2] = 30; t[0][1] = 60;
    memcpy(orig, t, sizeof(t));
    int nch = 0;
    CHECK(tv->getCollInfo(tctx, 4, bytes, 1, (float**)t, NA, NP, 0, &nch) == 0, "getCollInfo");
    /* NCCL's selection: argmin over available entries */
    int ca = -1, cp = -1;
    for (int a = 0; a < NA; a++) for (int p = 0; p < NP; p++)
      if (t[a][p] >= 0 && (ca < 0 || t[a][p] < t[ca][cp])) { ca = a; cp = p; }
    for (int a = 0; a < NA; a++) for (int p = 0; p < NP; p++)
      if (orig[a][p] < 0) CHECK(t[a][p] == orig[a][p], "an unavailable entry was touched");
    if (nch == 0) nch = 16;
    if (nch > 32) nch = 32;               /* NCCL clamps to the communicator's channels */
    size_t chunk = 1u << 20;
    tv->getChunkSize(tctx, 4, bytes, ca, cp, nch, &chunk);
    int shift = 0;
    while (shift < 20 && ((size_t)(1u << 20) >> shift) > chunk) shift++;
    double ns = synthetic_ns(ca, cp, nch, shift);
    /* the events NCCL emits for this collective: Coll, then one KernelCh per channel */
    descr_v5 d;
    memset(&d, 0, sizeof(d));
    d.type = 1 << 1;
    d.coll.func = "AllReduce"; d.coll.count = bytes / 2; d.coll.datatype = "ncclBfloat16";
    d.coll.nChannels = (uint8_t)nch; d.coll.algo = ALGO[ca]; d.coll.proto = PROTO[cp];
    void* h = NULL;
    pv->startEvent(pctx, &h, &d);
    CHECK(h != NULL, "no handle for a Coll event");
    for (int ch = 0; ch < nch; ch++) {
      descr_v5 k;
      memset(&k, 0, sizeof(k));
      k.type = 1 << 6; k.parentObj = h; k.kernelCh.channelId = (uint8_t)ch; k.kernelCh.pTimer = clock + (uint64_t)ch;
      void* kh = NULL;
      pv->startEvent(pctx, &kh, &k);
      if (ch == nch - 1) pv->stopEvent(h);  /* enqueue completes before the kernel does */
      state_args_v5 args;
      args.kernelCh.pTimer = clock + (uint64_t)ns;
      pv->recordEventState(kh, 22, &args);
      pv->stopEvent(kh);
    }
    clock += 10000000;
    if (ca == lastA && cp == lastP && nch == lastN && shift == lastS) {
      if (++stable == 200 && converged_at < 0) converged_at = it - 199;
    } else {
      stable = 0;
      converged_at = -1;
    }
    lastA = ca; lastP = cp; lastN = nch; lastS = shift;
  }
  CHECK(lastA == 1 && lastP == 2, "online tuning froze %s/%s, want Ring/Simple", ALGO[lastA], PROTO[lastP]);
  CHECK(lastN == 8, "online tuning froze %d channels, want 8", lastN);
  CHECK(lastS == 2, "online tuning froze chunk shift %d, want 2", lastS);
  CHECK(converged_at >= 0, "never settled");
  /* a communicator whose collectives are never profiled gives up and leaves NCCL alone */
  int untouched_after = -1;
  for (int it = 0; it < 1000; it++) {
    float t[NA][NP], orig[NA][NP];
    for (int a = 0; a < NA; a++) for (int p = 0; p < NP; p++) t[a][p] = IGNORE;
    t[1][0] = 50; t[1][1] = 20; t[1][2] = 25;
    memcpy(orig, t, sizeof(t));
    int nch = 0;
    CHECK(tv->getCollInfo(lonely, 4, bytes, 1, (float**)t, NA, NP, 0, &nch) == 0, "getCollInfo");
    if (memcmp(t, orig, sizeof(t)) == 0 && nch == 0) { if (untouched_after < 0) untouched_after = it; }
    else untouched_after = -1;
  }
  CHECK(untouched_after >= 0, "without profiler events the tuner never gave up");
  CHECK(tv->finalize(tctx) == 0 && tv->finalize(lonely) == 0 && pv->finalize(pctx) == 0, "finalize");
  printf("online (comm %llu): froze %s/%s channels=%d chunk>>%d after %d collectives; unprofiled comm released after %d calls; %d failures\n",
         (unsigned long long)id, ALGO[lastA], PROTO[lastP], lastN, lastS, converged_at, untouched_after,
         failures);
  return failures != 0;
}

typedef struct { void* lib; uint64_t id; int rc; } worker_t;

static void* worker(void* arg) {
  worker_t* w = (worker_t*)arg;
  w->rc = run_online(w->lib, w->id);
  return NULL;
}

/* NCCL may drive several communicators from several threads; each has its own state */
static int run_threads(void* lib) {
  enum { N = 4 };
  pthread_t th[N];
  worker_t w[N];
  for (int i = 0; i < N; i++) {
    w[i].lib = lib; w[i].id = 5000 + 10 * (uint64_t)i; w[i].rc = 1;
    if (pthread_create(&th[i], NULL, worker, &w[i]) != 0) { perror("pthread_create"); return 1; }
  }
  int rc = 0;
  for (int i = 0; i < N; i++) { pthread_join(th[i], NULL); rc |= w[i].rc; }
  return rc || failures != 0;
}

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s PLUGIN.so ROWS.txt|--online|--threads\n", argv[0]); return 2; }
  /* NCCL opens plugins with RTLD_LAZY | RTLD_LOCAL */
  void* lib = dlopen(argv[1], RTLD_LAZY | RTLD_LOCAL);
  if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 1; }
  int rc;
  if (strcmp(argv[2], "--online") == 0 || strcmp(argv[2], "--threads") == 0) {
    setenv("CCLC_TUNER_ONLINE", "1", 1);   /* read when a communicator is created */
    rc = strcmp(argv[2], "--online") == 0 ? run_online(lib, 777) : run_threads(lib);
  } else {
    rc = run_static(lib, argv[2]);
  }
  dlclose(lib);
  return rc;
}
