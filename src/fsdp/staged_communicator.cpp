#include "fsdp/staged_communicator.h"

#include <functional>
#include <vector>

#include "backend/cuda_backend.h"

namespace fsdpq {
namespace {

// The host operation in flight, then the copy of its result into the caller's buffer; the
// staging buffers live until then. A handle destroyed unwaited still waits for the host
// operation, but its result is dropped: the caller never asked for it.
class StagedPending final : public CollectiveHandle::Pending {
 public:
  StagedPending(CollectiveHandle host, std::function<void()> copy_back)
      : host_(std::move(host)), copy_back_(std::move(copy_back)) {}
  void wait() override {
    host_.wait();
    if (copy_back_) {
      auto copy = std::move(copy_back_);
      copy_back_ = nullptr;
      copy();
    }
  }

 private:
  CollectiveHandle host_;
  std::function<void()> copy_back_;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> host, Device device)
      : Communicator(host->rank(), host->size(), host->name()), host_(std::move(host)), device_(device) {}

  CollectiveHandle all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    auto in = stage_in(send, bytes_per_rank);
    auto out = std::make_shared<std::vector<uint8_t>>(bytes_per_rank * static_cast<size_t>(size()));
    CollectiveHandle h = host_->all_gather(in->data(), out->data(), bytes_per_rank);
    return later(std::move(h), [this, in, out, recv] { copy_bytes(recv, device_, out->data(), Device::CPU, out->size()); });
  }

  CollectiveHandle reduce_scatter(const void* send, void* recv, size_t count_per_rank, CommType type,
                                  ReduceOp op) override {
    const size_t bytes = count_per_rank * comm_type_size(type);
    auto in = stage_in(send, bytes * static_cast<size_t>(size()));
    auto out = std::make_shared<std::vector<uint8_t>>(bytes);
    CollectiveHandle h = host_->reduce_scatter(in->data(), out->data(), count_per_rank, type, op);
    return later(std::move(h), [this, in, out, recv] { copy_bytes(recv, device_, out->data(), Device::CPU, out->size()); });
  }

  CollectiveHandle all_reduce(void* buffer, size_t count, CommType type, ReduceOp op) override {
    auto staged = stage_in(buffer, count * comm_type_size(type));
    CollectiveHandle h = host_->all_reduce(staged->data(), count, type, op);
    return later(std::move(h), [this, staged, buffer] { copy_bytes(buffer, device_, staged->data(), Device::CPU, staged->size()); });
  }

  CollectiveHandle broadcast(void* buffer, size_t bytes, int root) override {
    auto staged = stage_in(buffer, bytes);
    CollectiveHandle h = host_->broadcast(staged->data(), bytes, root);
    return later(std::move(h), [this, staged, buffer] { copy_bytes(buffer, device_, staged->data(), Device::CPU, staged->size()); });
  }

  void barrier() override { host_->barrier(); }

 private:
  // A copy of the caller's input in host memory (a copy from the GPU waits for the work that
  // produced it).
  std::shared_ptr<std::vector<uint8_t>> stage_in(const void* src, size_t bytes) {
    auto staged = std::make_shared<std::vector<uint8_t>>(bytes);
    copy_bytes(staged->data(), Device::CPU, src, device_, bytes);
    return staged;
  }
  static CollectiveHandle later(CollectiveHandle host, std::function<void()> copy_back) {
    return CollectiveHandle(std::make_unique<StagedPending>(std::move(host), std::move(copy_back)));
  }

  std::unique_ptr<Communicator> host_;
  Device device_;
};

}  // namespace

std::unique_ptr<Communicator> make_staged_communicator(std::unique_ptr<Communicator> host, Device device) {
  return std::make_unique<StagedCommunicator>(std::move(host), device);
}

}  // namespace fsdpq
