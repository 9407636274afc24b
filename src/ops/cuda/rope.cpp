// RoPE on the GPU (kernels/rope.cuh); ops/rope.cpp checks the arguments, builds the tables and
// holds the CPU reference.
#include "kernels/rope.cuh"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {

void upload_rope_tables(const RopeTable& table) {
  if (table.cos_device.defined()) return;  // uploaded once, when a GPU first reads the table
  table.cos_device = copy_to(table.cos, Device::CUDA);
  table.sin_device = copy_to(table.sin, Device::CUDA);
}

void rope_rotate(const char* op, TensorView x, const RopeTable& table, int64_t position_offset,
                 const TensorView& positions, float sign) {
  if (x.numel() == 0) return;
  upload_rope_tables(table);
  cuda::rope_rotate(x.data, ktype(op, x), table.cos_device.data<float>(), table.sin_device.data<float>(), x.shape[0],
                    x.shape[1], x.shape[2], x.shape[3], position_offset, positions.as<const int32_t>(), sign,
                    cuda::stream());
}

}  // namespace fsdpq::cuda_ops
