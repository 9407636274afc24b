// LoRA dropout on the GPU (kernels/lora_dropout.cuh): the CPU's mask (kernels/lora_dropout_mask.h).
// ops/lora.cpp derives the keys and the threshold and holds the CPU reference.
#include "kernels/lora_dropout.cuh"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"
#include "ops/lora.h"

namespace fsdpq::cuda_ops {

static_assert(cuda::kMaxDropoutOutputs == static_cast<int>(kMaxLoraGroup));

namespace {
template <class Group>
Group dropout_group(std::span<const TensorView> tensors, std::span<const uint64_t> mixed_keys) {
  Group group{};
  group.count = static_cast<int>(mixed_keys.size());
  for (size_t i = 0; i < mixed_keys.size(); ++i) {
    group.data[i] = tensors[i].data;
    group.mixed_key[i] = mixed_keys[i];
  }
  return group;
}
}  // namespace

void lora_dropout_apply(std::span<const TensorView> outs, const TensorView& x, std::span<const uint64_t> mixed_keys,
                        uint32_t threshold, float keep_scale) {
  const auto targets = dropout_group<cuda::DropoutOutputs>(outs, mixed_keys);
  cuda::lora_dropout_apply(ktype("lora_dropout", x), targets, x.data, x.numel(), threshold, keep_scale, cuda::stream());
}

void lora_dropout_accumulate(TensorView dx, bool overwrite, std::span<const TensorView> gs,
                             std::span<const uint64_t> mixed_keys, uint32_t threshold, float keep_scale) {
  const auto gradients = dropout_group<cuda::DropoutGradients>(gs, mixed_keys);
  cuda::lora_dropout_accumulate(ktype("lora_backward", dx), dx.data, overwrite, ktype("lora_backward", gs[0]),
                                gradients, dx.numel(), threshold, keep_scale, cuda::stream());
}

}  // namespace fsdpq::cuda_ops
