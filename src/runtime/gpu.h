// Which GPU this rank drives: one GPU per local rank, when the machine has GPUs.
#pragma once
#include <cstdint>
#include <string>

#include "runtime/world.h"

namespace fsdpq {

struct GpuInfo {
  bool built_with_cuda = false;
  int visible_devices = 0;  // 0 on a machine without GPUs (or without a driver)
  int device = -1;          // the device this rank uses, -1 for the CPU backend
  std::string name;         // "NVIDIA H200", or why there is none
  uint64_t total_memory = 0;
  bool shared = false;       // more ranks on this node than GPUs (FSDPQ_SHARE_GPUS=1)
  bool has_gpu() const { return device >= 0; }
};

// Picks device local_rank (the launcher's CUDA_VISIBLE_DEVICES is honoured) and makes it
// current. More ranks on a node than GPUs is an error, as NCCL needs one GPU per rank.
GpuInfo select_gpu(const World& world);

}  // namespace fsdpq
