#include "fsdp/nccl_communicator.h"

#include <fmt/format.h>

#include <cstdlib>
#include <stdexcept>

#include "runtime/watchdog.h"
#include "util/error.h"

#ifdef FSDPQ_WITH_CUDA
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace fsdpq {

#ifndef FSDPQ_WITH_CUDA

bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm, std::string name, int, void*) {
  fail("the NCCL transport ('{}') needs a CUDA build of fsdpq", name);
}

#else

namespace {

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(fmt::format("CUDA {} failed: {}", what, cudaGetErrorString(err)));
}

void check_nccl(ncclResult_t result, const char* what) {
  if (result != ncclSuccess)
    throw std::runtime_error(fmt::format("NCCL {} failed: {} ({})", what, ncclGetErrorString(result),
                                         ncclGetLastError(nullptr) ? ncclGetLastError(nullptr) : ""));
}

ncclDataType_t nccl_type(CommType type) {
  switch (type) {
    case CommType::F32: return ncclFloat32;
    case CommType::F64: return ncclFloat64;
    case CommType::I64: return ncclInt64;
    case CommType::U64: return ncclUint64;
    case CommType::U8: return ncclUint8;
  }
  throw std::logic_error("nccl_type: unknown CommType");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  throw std::logic_error("nccl_op: unknown ReduceOp");
}

bool is_device_pointer(const void* p) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

// Completion of an operation queued on the communicator's stream; a host copy-back (staged
// host buffers) runs after it.
class NcclPending final : public CollectiveHandle::Pending {
 public:
  NcclPending(cudaEvent_t done, const std::string* where) : done_(done), where_(where) {}
  void wait() override {
    if (!done_) return;
    const WaitScope waiting("an NCCL collective", where_);
    cudaError_t err = cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
    done_ = nullptr;
    check_cuda(err, "event synchronize (a collective)");
  }
  ~NcclPending() override {
    if (done_) {
      cudaEventSynchronize(done_);
      cudaEventDestroy(done_);
    }
  }

 private:
  cudaEvent_t done_;
  const std::string* where_;  // the communicator's name
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, int rank, int size, std::string name, int device, cudaStream_t input)
      : Communicator(rank, size, std::move(name)), mpi_(comm), device_(device), input_(input) {
    check_cuda(cudaSetDevice(device_), "set device");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream create");
    check_cuda(cudaEventCreateWithFlags(&input_ready_, cudaEventDisableTiming), "event create");
    ncclUniqueId id{};
    if (rank == 0) check_nccl(ncclGetUniqueId(&id), "get unique id");
    {
      const WaitScope waiting("starting NCCL", &this->name());
      MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, mpi_);
      check_nccl(ncclCommInitRank(&comm_, size, id, rank), "communicator init");
    }
    check_cuda(cudaMalloc(&staging_, kStagingBytes), "malloc (staging)");
    // A peer's network failure surfaces as an asynchronous error; a stalled job is aborted (the
    // NCCL kernels end and the GPU is released) before the watchdog ends the process.
    health_check_ = add_watchdog_health_check([this]() -> std::optional<std::string> {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess || state == ncclSuccess || state == ncclInProgress)
        return std::nullopt;
      return fmt::format("NCCL reported an asynchronous error on communicator '{}': {} ({})", this->name(),
                         ncclGetErrorString(state), ncclGetLastError(comm_) ? ncclGetLastError(comm_) : "");
    });
    abort_hook_ = add_watchdog_abort_hook([this] { ncclCommAbort(comm_); });
  }
  ~NcclCommunicator() override {
    remove_watchdog_hook(health_check_);
    remove_watchdog_hook(abort_hook_);
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaFree(staging_);
    cudaEventDestroy(input_ready_);
    cudaStreamDestroy(stream_);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&mpi_);
  }

  CollectiveHandle all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    if (bytes_per_rank % kAllGatherGranule != 0)
      throw std::logic_error(fmt::format("all_gather: {} bytes per rank is not a multiple of {}", bytes_per_rank,
                                         kAllGatherGranule));
    begin();
    check_nccl(ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm_, stream_), "all-gather");
    return finish();
  }

  CollectiveHandle reduce_scatter(const void* send, void* recv, size_t count_per_rank, CommType type,
                                  ReduceOp op) override {
    begin();
    check_nccl(ncclReduceScatter(send, recv, count_per_rank, nccl_type(type), nccl_op(op), comm_, stream_),
               "reduce-scatter");
    return finish();
  }

  CollectiveHandle all_reduce(void* buffer, size_t count, CommType type, ReduceOp op) override {
    const size_t bytes = count * comm_type_size(type);
    void* device = stage_in(buffer, bytes);
    begin();
    check_nccl(ncclAllReduce(device, device, count, nccl_type(type), nccl_op(op), comm_, stream_), "all-reduce");
    return stage_out(buffer, device, bytes);
  }

  CollectiveHandle broadcast(void* buffer, size_t bytes, int root) override {
    void* device = stage_in(buffer, bytes);
    begin();
    check_nccl(ncclBroadcast(device, device, bytes, ncclUint8, root, comm_, stream_), "broadcast");
    return stage_out(buffer, device, bytes);
  }

  void barrier() override {
    const WaitScope waiting("barrier", &this->name());
    MPI_Barrier(mpi_);
  }

 private:
  static constexpr size_t kStagingBytes = 1 << 20;

  // The communicator's stream waits for the producer of the input.
  void begin() {
    check_cuda(cudaEventRecord(input_ready_, input_), "event record (input)");
    check_cuda(cudaStreamWaitEvent(stream_, input_ready_, 0), "stream wait");
  }
  CollectiveHandle finish() {
    cudaEvent_t done;
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "event create");
    check_cuda(cudaEventRecord(done, stream_), "event record");
    return CollectiveHandle(std::make_unique<NcclPending>(done, &this->name()));
  }
  // Host buffers go through the device staging area (small: scalars, flags, norms).
  void* stage_in(void* buffer, size_t bytes) {
    if (is_device_pointer(buffer)) return buffer;
    if (bytes > kStagingBytes)
      throw std::logic_error(fmt::format("NCCL {}: {} bytes of host memory exceed the staging area", this->name(), bytes));
    {
      const WaitScope waiting("an NCCL collective (staging)", &this->name());
      check_cuda(cudaStreamSynchronize(stream_), "stream synchronize");  // the staging area is free
    }
    check_cuda(cudaMemcpy(staging_, buffer, bytes, cudaMemcpyHostToDevice), "copy to device");
    return staging_;
  }
  CollectiveHandle stage_out(void* buffer, void* device, size_t bytes) {
    if (device == buffer) return finish();
    check_cuda(cudaMemcpyAsync(buffer, device, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
    CollectiveHandle handle = finish();
    handle.wait();  // the host buffer is the caller's as soon as this returns
    return handle;
  }

  MPI_Comm mpi_;
  int device_;
  cudaStream_t input_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t input_ready_ = nullptr;
  ncclComm_t comm_ = nullptr;
  void* staging_ = nullptr;
  int health_check_ = 0, abort_hook_ = 0;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, std::string name, int device, void* input_stream) {
  // NVLink SHARP / multicast needs fabric resources the lent machines do not grant; off unless asked.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  MPI_Comm dup;
  MPI_Comm_dup(comm, &dup);
  int rank = 0, size = 1;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &size);
  try {
    return std::make_unique<NcclCommunicator>(dup, rank, size, std::move(name), device,
                                              static_cast<cudaStream_t>(input_stream));
  } catch (const std::runtime_error& e) {
    fail("cannot start the NCCL transport on GPU {} (rank {} of {}): {}", device, rank, size, e.what());
  }
}

#endif

}  // namespace fsdpq
