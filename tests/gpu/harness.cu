// The GPU tier's file-in/file-out driver of a generated NCCL library, one process per rank.
// Built by gpu_helpers.build_harness with -DCCLC_HEADER="cclc_<name>.h" -DCCLC_FN=cclc_<name>
// -DCCLC_RELEASE=cclc_<name>_release.
// usage: harness DIR COUNT DTYPE RANK NRANKS IN_BYTES OUT_BYTES SHARED_BYTES IN_AT OUT_AT
// SHARED_BYTES 0: separate input and output buffers; else one buffer of that size holding the
// input at byte IN_AT and the output at byte OUT_AT (in place). NCCL_COMM_ID names the
// bootstrap address, so every rank computes the same unique id and no MPI is needed.
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#include <vector>

#include CCLC_HEADER

#define CHECK(what, ok)                                                   \
  do {                                                                    \
    if (!(ok)) {                                                          \
      fprintf(stderr, "rank %d: %s failed\n", rank, what);                \
      return 1;                                                           \
    }                                                                     \
  } while (0)

int main(int argc, char** argv) {
  if (argc != 11) {
    fprintf(stderr, "usage: %s DIR COUNT DTYPE RANK NRANKS IN_BYTES OUT_BYTES SHARED IN_AT "
                    "OUT_AT\n", argv[0]);
    return 2;
  }
  const size_t count = strtoull(argv[2], nullptr, 10);
  const int dtype = atoi(argv[3]), rank = atoi(argv[4]), nranks = atoi(argv[5]);
  const size_t in_bytes = strtoull(argv[6], nullptr, 10), out_bytes = strtoull(argv[7], nullptr, 10);
  const size_t shared = strtoull(argv[8], nullptr, 10), in_at = strtoull(argv[9], nullptr, 10),
               out_at = strtoull(argv[10], nullptr, 10);
  std::vector<char> host((in_bytes > out_bytes ? in_bytes : out_bytes) + 1);
  char path[4096];
  snprintf(path, sizeof path, "%s/in.%d.bin", argv[1], rank);
  FILE* f = fopen(path, "rb");
  CHECK("reading the input", f != nullptr && fread(host.data(), 1, in_bytes, f) == in_bytes);
  fclose(f);
  CHECK("cudaSetDevice", cudaSetDevice(0) == cudaSuccess);
  char *send = nullptr, *recv = nullptr;
  if (shared) {
    CHECK("cudaMalloc", cudaMalloc((void**)&send, shared) == cudaSuccess);
    CHECK("cudaMemset", cudaMemset(send, 0, shared) == cudaSuccess);
    recv = send + out_at;
    send += in_at;
  } else {
    CHECK("cudaMalloc", cudaMalloc((void**)&send, in_bytes + 1) == cudaSuccess);
    CHECK("cudaMalloc", cudaMalloc((void**)&recv, out_bytes + 1) == cudaSuccess);
    CHECK("cudaMemset", cudaMemset(recv, 0, out_bytes) == cudaSuccess);
  }
  CHECK("copying the input", cudaMemcpy(send, host.data(), in_bytes, cudaMemcpyHostToDevice) ==
                             cudaSuccess);
  ncclUniqueId id;
  CHECK("ncclGetUniqueId", ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm;
  CHECK("ncclCommInitRank", ncclCommInitRank(&comm, nranks, id, rank) == ncclSuccess);
  cudaStream_t stream;
  CHECK("cudaStreamCreate", cudaStreamCreate(&stream) == cudaSuccess);
  const ncclResult_t r = CCLC_FN(send, recv, count, (ncclDataType_t)dtype, comm, stream);
  if (r != ncclSuccess) fprintf(stderr, "rank %d: %s\n", rank, ncclGetErrorString(r));
  CHECK("the cclc collective", r == ncclSuccess);
  CHECK("cudaStreamSynchronize", cudaStreamSynchronize(stream) == cudaSuccess);
  CHECK("copying the output", cudaMemcpy(host.data(), recv, out_bytes, cudaMemcpyDeviceToHost) ==
                              cudaSuccess);
  snprintf(path, sizeof path, "%s/out.%d.bin", argv[1], rank);
  f = fopen(path, "wb");
  CHECK("writing the output", f != nullptr && fwrite(host.data(), 1, out_bytes, f) == out_bytes);
  fclose(f);
  // the library keeps its lane communicators until released, before the parent is destroyed
  CHECK("releasing the library's lanes", CCLC_RELEASE(comm) == ncclSuccess);
  ncclCommDestroy(comm);
  return 0;
}
