// use_cpu_offload for the frozen base weights of a unit a rank holds whole (a shard group of one:
// one GPU, or ddp): the unit's frozen bytes wait in page-locked host memory, in the unit's flat
// layout (fsdp/frozen_layout.h), and are copied to the compute device on a side stream ahead of
// use and freed after it, so the GPU holds a few layers' base weights instead of the model's
// (what FSDP's CPUOffload(offload_params=True) does for fsdp_qlora). Shard groups of more than one
// rank get the same effect from gathering each unit into memory that is freed after use.
//
// On the CPU backend the copies are memcpys into the weights' host storage, so the same code
// paths run in the CPU tests.
#pragma once
#include <cstddef>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/side_stream.h"
#include "fsdp/frozen_layout.h"
#include "model/llama_weights.h"

namespace fsdpq {

class OffloadedFrozen {
 public:
  // Packs the unit's built frozen weights into host memory and frees their own storage. `device`
  // is where the model computes.
  OffloadedFrozen(const ParamUnit& unit, Device device);
  OffloadedFrozen(const OffloadedFrozen&) = delete;
  OffloadedFrozen& operator=(const OffloadedFrozen&) = delete;

  // The unit's weights after the model moved (the same weights, in the same order).
  void rebind(const std::vector<BaseWeight*>& weights);
  // Queues the copy to the device on `copies` unless the weights are there or on their way.
  void fetch(SideStream& copies);
  // fetch, then work queued on the compute stream from here on sees the weights.
  void ensure(SideStream& copies);
  // Frees the device copies (the host bytes stay).
  void evict();
  bool present() const { return state_ != State::Evicted; }
  size_t host_bytes() const { return layout_.frozen_bytes; }

 private:
  enum class State { Evicted, InFlight, Ready };
  std::vector<BaseWeight*> weights_;
  UnitLayout layout_;
  Device device_;
  HostStaging host_;
  State state_ = State::Evicted;
  StreamMark copied_;
};

// Allocates the weight's storage for one segment on `device` and returns where its bytes go:
// what a gathered or fetched unit is unpacked into.
uint8_t* allocate_segment_storage(BaseWeight& weight, const FrozenSegment& segment, Device device);

// Frees a frozen weight's storage on every device (its scalars and its shape stay).
void evict_frozen_storage(BaseWeight& weight);

}  // namespace fsdpq
