// Rotary position embedding in HF Llama's half-split layout: dimension i pairs with i + D/2,
//   rope(x) = x * cos + rotate_half(x) * sin,  rotate_half(x) = cat(-x[D/2:], x[:D/2]).
#pragma once
#include "backend/tensor.h"

#include <cstdint>
#include <vector>

namespace fsdpq {

// config.json's rope_scaling. Only "llama3" (Llama 3.1+) changes the frequencies here.
struct RopeScalingParams {
  enum class Type : uint8_t { None, Llama3 };
  Type type = Type::None;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct RopeTable {
  int64_t head_dim = 0;
  int64_t max_positions = 0;
  std::vector<float> inv_freq;  // [D/2], fp32 as transformers computes it
  Tensor cos;                   // F32 [max_positions, D]: cos(p * inv_freq[i mod D/2])
  Tensor sin;                   // F32 [max_positions, D]
  // Device copies of cos/sin for the CUDA backend: made by the first rope call on CUDA tensors
  // (copy_to, which waits for the copy) and kept for the table's lifetime; empty until then.
  // Not thread-safe: the ops of one rank run on one thread.
  mutable Tensor cos_device;
  mutable Tensor sin_device;
};

// inv_freq[i] = 1 / theta^(2i/D) in fp32 (transformers' _compute_default_rope_parameters), then
// llama3 scaling as in _compute_llama3_parameters; the tables hold emb = cat(freqs, freqs).
RopeTable make_rope_table(int64_t head_dim, int64_t max_positions, double theta,
                          const RopeScalingParams& scaling = {});

// In place on x [B, T, heads, D] (F32, BF16 or F16): token t sits at position position_offset + t.
// Math in fp32 with the fp32 tables, one rounding to x's dtype per element.
// positions: optional I32 [B, T] on x's device; given, token (b, t) sits at position_offset +
// positions[b, t] instead (packed rows restart at 0 with each example: docs/packing.md). The CPU
// checks that every position is in the table; on the GPU the caller guarantees it.
void rope_forward(TensorView x, const RopeTable& table, int64_t position_offset = 0, const TensorView& positions = {});

// What rope_forward and rope_backward check of their arguments (x the tensor they rotate), for an
// op that applies the rotation inside another (ops/attention.h, attention_rope_backward).
void check_rope_arguments(const char* op, const TensorView& x, const RopeTable& table, int64_t position_offset,
                          const TensorView& positions);

// In place on dx: the transpose of the forward rotation, i.e. the rotation by the opposite angle:
//   dx = dy * cos - rotate_half(dy) * sin.
void rope_backward(TensorView dx, const RopeTable& table, int64_t position_offset = 0,
                   const TensorView& positions = {});

}  // namespace fsdpq
