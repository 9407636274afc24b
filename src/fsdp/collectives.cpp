#include "fsdp/collectives.h"

#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "runtime/watchdog.h"

namespace fsdpq {
namespace {

MPI_Datatype mpi_type(CommType type) {
  switch (type) {
    case CommType::F32: return MPI_FLOAT;
    case CommType::F64: return MPI_DOUBLE;
    case CommType::I64: return MPI_INT64_T;
    case CommType::U64: return MPI_UINT64_T;
    case CommType::U8: return MPI_UINT8_T;
  }
  throw std::logic_error("mpi_type: unknown CommType");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  throw std::logic_error("mpi_op: unknown ReduceOp");
}

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(fmt::format("MPI {} failed: {}", what, std::string(text, static_cast<size_t>(length))));
}

// MPI counts are ints: larger messages fail here, clearly, instead of wrapping around.
int checked_count(size_t count, const char* what) {
  if (count > static_cast<size_t>(INT_MAX))
    throw std::runtime_error(fmt::format("MPI {}: {} elements per rank exceed MPI's int count limit; use more ranks "
                                         "(smaller shards)", what, count));
  return static_cast<int>(count);
}

class MpiPending final : public CollectiveHandle::Pending {
 public:
  MpiPending(MPI_Request request, const char* what, const std::string* where)
      : request_(request), what_(what), where_(where) {}
  void wait() override {
    if (request_ == MPI_REQUEST_NULL) return;
    const WaitScope waiting(what_, where_);
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), what_);
  }
  ~MpiPending() override {
    if (request_ != MPI_REQUEST_NULL) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }

 private:
  MPI_Request request_;
  const char* what_;
  const std::string* where_;  // the communicator's name
};

CollectiveHandle handle_of(MPI_Request request, const char* what, const std::string* where) {
  return CollectiveHandle(std::make_unique<MpiPending>(request, what, where));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size, std::string name)
      : Communicator(rank, size, std::move(name)), comm_(comm) {
    // All-gathers move whole granules, so per-rank byte counts up to 128 GiB fit MPI's int counts.
    check_mpi(MPI_Type_contiguous(static_cast<int>(kAllGatherGranule), MPI_BYTE, &granule_), "Type_contiguous");
    check_mpi(MPI_Type_commit(&granule_), "Type_commit");
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Type_free(&granule_);
    MPI_Comm_free(&comm_);
  }

  CollectiveHandle all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    if (bytes_per_rank % kAllGatherGranule != 0)
      throw std::logic_error(fmt::format("all_gather: {} bytes per rank is not a multiple of {}", bytes_per_rank,
                                         kAllGatherGranule));
    if (size() == 1) return local_copy(send, recv, bytes_per_rank);
    const int count = checked_count(bytes_per_rank / kAllGatherGranule, "all-gather");
    MPI_Request request;
    check_mpi(MPI_Iallgather(send, count, granule_, recv, count, granule_, comm_, &request), "all-gather");
    return handle_of(request, "all-gather", &name());
  }

  CollectiveHandle reduce_scatter(const void* send, void* recv, size_t count_per_rank, CommType type,
                                  ReduceOp op) override {
    if (size() == 1) return local_copy(send, recv, count_per_rank * comm_type_size(type));
    const int count = checked_count(count_per_rank, "reduce-scatter");
    MPI_Request request;
    check_mpi(MPI_Ireduce_scatter_block(send, recv, count, mpi_type(type), mpi_op(op), comm_, &request),
              "reduce-scatter");
    return handle_of(request, "reduce-scatter", &name());
  }

  CollectiveHandle all_reduce(void* buffer, size_t count, CommType type, ReduceOp op) override {
    if (size() == 1) return {};
    const int n = checked_count(count, "all-reduce");
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buffer, n, mpi_type(type), mpi_op(op), comm_, &request), "all-reduce");
    return handle_of(request, "all-reduce", &name());
  }

  CollectiveHandle broadcast(void* buffer, size_t bytes, int root) override {
    if (size() == 1) return {};
    const int n = checked_count(bytes, "broadcast");
    MPI_Request request;
    check_mpi(MPI_Ibcast(buffer, n, MPI_BYTE, root, comm_, &request), "broadcast");
    return handle_of(request, "broadcast", &name());
  }

  void barrier() override {
    if (size() == 1) return;
    const WaitScope waiting("barrier", &name());
    check_mpi(MPI_Barrier(comm_), "barrier");
  }

 private:
  // A group of one (DDP's shard group, FSDP's replicate group): the collective is a copy.
  static CollectiveHandle local_copy(const void* send, void* recv, size_t bytes) {
    if (send != recv && bytes) std::memcpy(recv, send, bytes);
    return {};
  }

  MPI_Comm comm_;
  MPI_Datatype granule_;
};

}  // namespace

size_t comm_type_size(CommType type) {
  switch (type) {
    case CommType::F32: return 4;
    case CommType::F64: case CommType::I64: case CommType::U64: return 8;
    case CommType::U8: return 1;
  }
  return 0;
}

CollectiveHandle& CollectiveHandle::operator=(CollectiveHandle&& other) noexcept {
  if (this != &other) {
    pending_.reset();  // waits for the collective this handle held
    pending_ = std::move(other.pending_);
  }
  return *this;
}

CollectiveHandle::~CollectiveHandle() = default;  // Pending's destructor waits

void CollectiveHandle::wait() {
  if (!pending_) return;
  pending_->wait();
  pending_.reset();
}

double Communicator::all_reduce_sum(double value) {
  all_reduce(&value, 1, CommType::F64, ReduceOp::Sum).wait();
  return value;
}

double Communicator::all_reduce_max(double value) {
  all_reduce(&value, 1, CommType::F64, ReduceOp::Max).wait();
  return value;
}

int64_t Communicator::all_reduce_sum(int64_t value) {
  all_reduce(&value, 1, CommType::I64, ReduceOp::Sum).wait();
  return value;
}

bool Communicator::any(bool flag) {
  int64_t v = flag ? 1 : 0;
  all_reduce(&v, 1, CommType::I64, ReduceOp::Max).wait();
  return v != 0;
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, std::string name) {
  MPI_Comm dup;
  check_mpi(MPI_Comm_dup(comm, &dup), "Comm_dup");
  int rank = 0, size = 1;
  MPI_Comm_rank(dup, &rank);
  MPI_Comm_size(dup, &size);
  return std::make_unique<MpiCommunicator>(dup, rank, size, std::move(name));
}

}  // namespace fsdpq
