/* NCCL's profiler plugin ABI v5 as the tuner/profiler harnesses drive it (NCCL 2.26+
 * ncclProfilerEventDescr_v5 and ncclProfiler_v5): one restatement for both harnesses, which
 * define ncclResult_t and logger_t before including it. */
#ifndef CCLC_TEST_PROFILER_V5_H
#define CCLC_TEST_PROFILER_V5_H
#include <stdint.h>
#include <sys/types.h>

typedef struct {
  uint64_t type;
  void* parentObj;
  int rank;
  union {
    struct { uint64_t seqNumber; const char* func; const void* sendBuff; void* recvBuff;
             size_t count; int root; const char* datatype; uint8_t nChannels; uint8_t nWarps;
             const char* algo; const char* proto; void* parentGroup; } coll;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } proxyOp;
    struct { int step; } proxyStep;
  };
} descr_v5;
typedef union { struct { size_t transSize; } proxyStep; struct { uint64_t pTimer; } kernelCh; } state_args_v5;
typedef struct {
  const char* name;
  ncclResult_t (*init)(void**, uint64_t, int*, const char*, int, int, int, logger_t);
  ncclResult_t (*startEvent)(void*, void**, descr_v5*);
  ncclResult_t (*stopEvent)(void*);
  ncclResult_t (*recordEventState)(void*, int, state_args_v5*);
  ncclResult_t (*finalize)(void*);
} profiler_v5;

#endif
