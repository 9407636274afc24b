// The collectives sharded training needs — all-gather, reduce-scatter, all-reduce, broadcast,
// barrier — over one group of ranks, asynchronous with completion handles. One interface, three
// transports: MPI over host buffers (the CPU backend, and every rank's small or rare collectives;
// this file), NCCL over device buffers (the CUDA backend's gathers and reductions), and MPI
// staged through the host for device buffers where NCCL cannot run (fsdp/staged_communicator.h;
// fsdp/device_collectives.h picks). Callers never see which one they use.
//
// Every rank of a group must issue the same collectives in the same order (MPI's and NCCL's
// rule); the FSDP engine guarantees it by walking the same units in the same order everywhere.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace fsdpq {

// Element types a reduction understands (all-gather and broadcast move bytes).
enum class CommType : uint8_t { F32, F64, I64, U64, U8 };
size_t comm_type_size(CommType type);

enum class ReduceOp : uint8_t { Sum, Max, Min };

// A collective in flight. wait() returns once this rank's part is complete (its output buffer
// may be read, its input reused); a handle that is destroyed unwaited waits first, so a buffer is
// never freed under a running collective.
class CollectiveHandle {
 public:
  struct Pending {
    virtual ~Pending() = default;
    virtual void wait() = 0;
  };
  CollectiveHandle() = default;
  explicit CollectiveHandle(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
  CollectiveHandle(CollectiveHandle&&) noexcept = default;
  CollectiveHandle& operator=(CollectiveHandle&& other) noexcept;
  ~CollectiveHandle();
  void wait();
  bool pending() const { return pending_ != nullptr; }

 private:
  std::unique_ptr<Pending> pending_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }  // "world", "shard", "replicate": for messages

  // recv[r * bytes_per_rank, (r+1) * bytes_per_rank) = rank r's send. bytes_per_rank must be a
  // multiple of kAllGatherGranule (the FSDP engine pads its shards to it).
  static constexpr size_t kAllGatherGranule = 64;
  virtual CollectiveHandle all_gather(const void* send, void* recv, size_t bytes_per_rank) = 0;
  // recv[0, count_per_rank) = op over ranks of send[rank * count_per_rank, ...).
  virtual CollectiveHandle reduce_scatter(const void* send, void* recv, size_t count_per_rank, CommType type,
                                          ReduceOp op) = 0;
  // In place: buffer[0, count) = op over ranks of everyone's buffer.
  virtual CollectiveHandle all_reduce(void* buffer, size_t count, CommType type, ReduceOp op) = 0;
  virtual CollectiveHandle broadcast(void* buffer, size_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Blocking conveniences for scalars (metrics, flags, norms).
  double all_reduce_sum(double value);
  double all_reduce_max(double value);
  int64_t all_reduce_sum(int64_t value);
  bool any(bool flag);

 protected:
  Communicator(int rank, int size, std::string name) : rank_(rank), size_(size), name_(std::move(name)) {}

 private:
  int rank_, size_;
  std::string name_;
};

// The MPI transport over an MPI communicator (duplicated, so its traffic never mixes with other
// users of the same ranks). Buffers are host memory.
std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name);

}  // namespace fsdpq
