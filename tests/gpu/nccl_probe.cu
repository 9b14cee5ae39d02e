// NCCL's own collectives, one process per rank, for NCCL's logs: with NCCL_DEBUG=INFO and
// NCCL_DEBUG_SUBSYS=INIT,GRAPH,TUNING, rank 0 prints the graphs NCCL searched, its
// latency/bandwidth table, and the algorithm and protocol it chose for every call. Those logs are
// test data for cclc's replica of NCCL's tuning model (tests/nccl_model/).
// usage: nccl_probe RANK NRANKS MIN_BYTES MAX_BYTES
// Sizes step by 4x from MIN_BYTES to MAX_BYTES; every collective runs once per size on floats
// (AllToAll as grouped send/recv, as nccl-tests does). NCCL_COMM_ID names the bootstrap
// address, so every rank computes the same unique id and no MPI is needed. Prints one line per
// call on rank 0 and exits non-zero on any NCCL or CUDA error.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(what, call)                                                             \
  do {                                                                                \
    if (!(call)) {                                                                    \
      fprintf(stderr, "rank %d: %s failed\n", rank, what);                            \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)
#define NCCL_OK(what, call)                                                           \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      fprintf(stderr, "rank %d: %s: %s\n", rank, what, ncclGetErrorString(r_));      \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

int main(int argc, char** argv) {
  int rank = -1;
  if (argc != 5) {
    fprintf(stderr, "usage: %s RANK NRANKS MIN_BYTES MAX_BYTES\n", argv[0]);
    return 2;
  }
  rank = atoi(argv[1]);
  const int n = atoi(argv[2]);
  const size_t min_bytes = strtoull(argv[3], nullptr, 10), max_bytes = strtoull(argv[4], nullptr, 10);
  if (n < 1 || rank < 0 || rank >= n || min_bytes < 4 * (size_t)n || max_bytes < min_bytes) {
    fprintf(stderr, "rank %d: bad arguments\n", rank);
    return 2;
  }
  CHECK("cudaSetDevice", cudaSetDevice(0) == cudaSuccess);
  // the largest buffer any call needs: AllGather's output, n times the per-rank input
  float *send = nullptr, *recv = nullptr;
  CHECK("cudaMalloc", cudaMalloc((void**)&send, max_bytes * n) == cudaSuccess);
  CHECK("cudaMalloc", cudaMalloc((void**)&recv, max_bytes * n) == cudaSuccess);
  CHECK("cudaMemset", cudaMemset(send, 0, max_bytes * n) == cudaSuccess);
  ncclUniqueId id;
  NCCL_OK("ncclGetUniqueId", ncclGetUniqueId(&id));
  ncclComm_t comm;
  NCCL_OK("ncclCommInitRank", ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t stream;
  CHECK("cudaStreamCreate", cudaStreamCreate(&stream) == cudaSuccess);
  int version = 0;
  NCCL_OK("ncclGetVersion", ncclGetVersion(&version));
  if (rank == 0) printf("nccl_probe: NCCL %d, %d ranks\n", version, n);
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float), part = count / n;
    NCCL_OK("ncclAllReduce", ncclAllReduce(send, recv, count, ncclFloat, ncclSum, comm, stream));
    NCCL_OK("ncclAllGather", ncclAllGather(send, recv, count, ncclFloat, comm, stream));
    NCCL_OK("ncclReduceScatter",
            ncclReduceScatter(send, recv, part, ncclFloat, ncclSum, comm, stream));
    NCCL_OK("ncclBroadcast", ncclBroadcast(send, recv, count, ncclFloat, 0, comm, stream));
    NCCL_OK("ncclReduce", ncclReduce(send, recv, count, ncclFloat, ncclSum, 0, comm, stream));
    NCCL_OK("ncclGroupStart", ncclGroupStart());
    for (int peer = 0; peer < n; ++peer) {
      NCCL_OK("ncclSend", ncclSend(send + peer * part, part, ncclFloat, peer, comm, stream));
      NCCL_OK("ncclRecv", ncclRecv(recv + peer * part, part, ncclFloat, peer, comm, stream));
    }
    NCCL_OK("ncclGroupEnd", ncclGroupEnd());
    CHECK("cudaStreamSynchronize", cudaStreamSynchronize(stream) == cudaSuccess);
    if (rank == 0) printf("nccl_probe: %zu bytes: 6 collectives done\n", bytes);
  }
  NCCL_OK("ncclCommDestroy", ncclCommDestroy(comm));
  return 0;
}
