// The GPU tier's file-in/file-out driver of an MSCCL++ execution plan, one process per rank:
// MSCCL++'s own Executor (microsoft/mscclpp, include/mscclpp/executor.hpp) runs the plan that
// cclc wrote, on GPU 0, and the output buffer is written back for numpy to check.
// usage: mscclpp_harness PLAN DIR RANK NRANKS ADDR IN_BYTES OUT_BYTES DTYPE [SEND_AT RECV_AT]
// ADDR: [interface:]ip:port where rank 0's TcpBootstrap listens (no MPI needed).
// DTYPE: 0 fp32, 1 fp16, 2 int32. Reads DIR/in.RANK.bin, writes DIR/out.RANK.bin. Out of place
// by default; with SEND_AT and RECV_AT, in place: one buffer of max(IN_BYTES, OUT_BYTES) bytes
// whose input starts at byte SEND_AT and output at RECV_AT (NCCL's in-place layouts).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#include <exception>
#include <memory>
#include <mscclpp/core.hpp>
#include <mscclpp/executor.hpp>
#include <mscclpp/gpu_utils.hpp>
#include <string>
#include <vector>

static int fail(int rank, const char* what) {
  fprintf(stderr, "rank %d: %s failed\n", rank, what);
  return 1;
}

static int run(char** argv) {
  const std::string plan_path = argv[1], dir = argv[2], addr = argv[5];
  const int rank = atoi(argv[3]), nranks = atoi(argv[4]), dtype = atoi(argv[8]);
  const size_t in_bytes = strtoull(argv[6], nullptr, 10), out_bytes = strtoull(argv[7], nullptr, 10);
  const mscclpp::DataType types[] = {mscclpp::DataType::FLOAT32, mscclpp::DataType::FLOAT16,
                                     mscclpp::DataType::INT32};
  const bool inplace = argv[9] != nullptr;
  const size_t send_at = inplace ? strtoull(argv[9], nullptr, 10) : 0;
  const size_t recv_at = inplace ? strtoull(argv[10], nullptr, 10) : 0;
  if (dtype < 0 || dtype > 2) return fail(rank, "reading the arguments");
  std::vector<char> host(in_bytes > out_bytes ? in_bytes : out_bytes);
  const std::string in_path = dir + "/in." + std::to_string(rank) + ".bin";
  FILE* f = fopen(in_path.c_str(), "rb");
  if (f == nullptr || fread(host.data(), 1, in_bytes, f) != in_bytes) return fail(rank, "reading the input");
  fclose(f);
  if (cudaSetDevice(0) != cudaSuccess) return fail(rank, "cudaSetDevice");
  auto bootstrap = std::make_shared<mscclpp::TcpBootstrap>(rank, nranks);
  bootstrap->initialize(addr);
  auto communicator = std::make_shared<mscclpp::Communicator>(bootstrap);
  auto executor = std::make_shared<mscclpp::Executor>(communicator);
  mscclpp::ExecutionPlan plan(plan_path, rank);
  // out of place: two allocations (as the run that passed had them); in place: one, the input
  // and the output at their offsets in it
  std::shared_ptr<char> in_buf = mscclpp::GpuBuffer(inplace ? host.size() : in_bytes).memory();
  std::shared_ptr<char> out_buf = inplace ? in_buf : mscclpp::GpuBuffer(out_bytes).memory();
  char* send = in_buf.get() + send_at;
  char* recv = out_buf.get() + recv_at;
  if (cudaMemset(recv, 0, out_bytes) != cudaSuccess) return fail(rank, "cudaMemset");
  if (cudaMemcpy(send, host.data(), in_bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    return fail(rank, "copying the input");
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return fail(rank, "cudaStreamCreate");
  executor->execute(rank, send, recv, in_bytes, out_bytes, types[dtype], plan, stream);
  if (cudaStreamSynchronize(stream) != cudaSuccess) return fail(rank, "the plan's kernel");
  bootstrap->barrier();
  if (cudaMemcpy(host.data(), recv, out_bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    return fail(rank, "copying the output");
  const std::string out_path = dir + "/out." + std::to_string(rank) + ".bin";
  f = fopen(out_path.c_str(), "wb");
  if (f == nullptr || fwrite(host.data(), 1, out_bytes, f) != out_bytes) return fail(rank, "writing the output");
  fclose(f);
  cudaStreamDestroy(stream);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 9 && argc != 11) {
    fprintf(stderr, "usage: %s PLAN DIR RANK NRANKS ADDR IN_BYTES OUT_BYTES DTYPE [SEND_AT RECV_AT]\n",
            argv[0]);
    return 2;
  }
  try {
    return run(argv);
  } catch (const std::exception& e) {
    fprintf(stderr, "rank %s: %s\n", argv[3], e.what());
    return 1;
  }
}
