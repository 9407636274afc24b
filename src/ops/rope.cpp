#include "ops/rope.h"

#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/parallel.h"
#include "ops/storage.h"
#include "util/error.h"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace fsdpq {

namespace {

// transformers builds inv_freq with fp32 tensor ops. `a / tensor` with a Python scalar `a` is
// evaluated as tensor.reciprocal() * a, and every scalar enters the math as fp32; mirror that.
std::vector<float> default_inv_freq(int64_t head_dim, double theta) {
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[static_cast<size_t>(i)] = (1.0f / std::pow(base, exponent)) * 1.0f;
  }
  return inv_freq;
}

void apply_llama3_scaling(std::vector<float>& inv_freq, const RopeScalingParams& p) {
  if (!(p.factor > 0.0) || !(p.high_freq_factor > p.low_freq_factor) || p.low_freq_factor <= 0.0 ||
      p.original_max_position_embeddings <= 0)
    fail("rope_scaling (llama3): need factor > 0, 0 < low_freq_factor < high_freq_factor and "
         "original_max_position_embeddings > 0; got factor={}, low_freq_factor={}, high_freq_factor={}, "
         "original_max_position_embeddings={}",
         p.factor, p.low_freq_factor, p.high_freq_factor, p.original_max_position_embeddings);
  const double old_context = static_cast<double>(p.original_max_position_embeddings);
  // Python-float arithmetic (double), then fp32 when it meets the tensor.
  const float low_freq_wavelen = static_cast<float>(old_context / p.low_freq_factor);
  const float high_freq_wavelen = static_cast<float>(old_context / p.high_freq_factor);
  const float factor = static_cast<float>(p.factor);
  const float low = static_cast<float>(p.low_freq_factor);
  const float ramp_width = static_cast<float>(p.high_freq_factor - p.low_freq_factor);
  const float two_pi = static_cast<float>(2.0 * std::numbers::pi);
  const float old_context_f = static_cast<float>(old_context);

  for (float& freq : inv_freq) {
    const float wavelen = (1.0f / freq) * two_pi;
    // Long wavelengths (low frequencies) are slowed down by `factor`; short ones are kept.
    float scaled = wavelen > low_freq_wavelen ? freq / factor : freq;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const float smooth = ((1.0f / wavelen) * old_context_f - low) / ramp_width;
      scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
    }
    freq = scaled;
  }
}

// Rotates each (i, i + D/2) pair by the table's angle; sign = -1 rotates the other way (backward).
// positions: null (token t at position_offset + t) or [B, T] (at position_offset + positions[b, t]).
template <class S>
void rotate_pairs(TensorView x, const RopeTable& table, int64_t position_offset, const int32_t* positions,
                  float sign) {
  const int64_t B = x.shape[0], T = x.shape[1], heads = x.shape[2], D = x.shape[3], half = D / 2;
  const float* cos_table = table.cos.data<float>();
  const float* sin_table = table.sin.data<float>();
  S* data = x.as<S>();
#pragma omp parallel for if (worth_parallel(x.numel())) collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t position = position_offset + (positions != nullptr ? positions[b * T + t] : t);
      const float* cos_row = cos_table + position * D;
      const float* sin_row = sin_table + position * D;
      for (int64_t h = 0; h < heads; ++h) {
        S* v = data + ((b * T + t) * heads + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = to_f32(v[i]), x2 = to_f32(v[i + half]);
          const float s1 = sign * sin_row[i], s2 = sign * sin_row[i + half];
          v[i] = from_f32<S>(x1 * cos_row[i] - x2 * s1);
          v[i + half] = from_f32<S>(x2 * cos_row[i + half] + x1 * s2);
        }
      }
    }
}

// Per-token positions: I32 [B, T] on x's device, each (on the CPU) inside the table.
void check_positions(const char* op, const TensorView& x, const RopeTable& table, int64_t position_offset,
                     const TensorView& positions) {
  check_dtype(op, "positions", positions, DType::I32);
  check_shape(op, "positions", positions, Shape{x.shape[0], x.shape[1]});
  if (positions.device != Device::CPU) return;
  const int32_t* p = positions.as<const int32_t>();
  for (int64_t i = 0; i < positions.numel(); ++i)
    check_that(p[i] >= 0 && position_offset + p[i] < table.max_positions,
               "{}: positions[{}, {}] is {}; with offset {} it must fall in the table's {} positions", op,
               i / x.shape[1], i % x.shape[1], p[i], position_offset, table.max_positions);
}

void rope_apply(TensorView x, const RopeTable& table, int64_t position_offset, const TensorView& positions,
                float sign, const char* op) {
  check_rope_arguments(op, x, table, position_offset, positions);
  if (runs_on_cuda(op, {x, positions}))
    if constexpr (kWithCuda) return cuda_ops::rope_rotate(op, x, table, position_offset, positions, sign);
  const int32_t* per_token = positions.as<const int32_t>();
  with_storage(x.dtype, op,
               [&](auto tag) { rotate_pairs<decltype(tag)>(x, table, position_offset, per_token, sign); });
}

}  // namespace

void check_rope_arguments(const char* op, const TensorView& x, const RopeTable& table, int64_t position_offset,
                          const TensorView& positions) {
  check_float(op, "x", x);
  check_that(x.shape.rank == 4, "{}: x must be [B, T, heads, D], got {}", op, x.shape.to_string());
  check_that(x.shape[3] == table.head_dim, "{}: x {} has head_dim {} but the table was built for {}", op,
             x.shape.to_string(), x.shape[3], table.head_dim);
  // Per-token positions (packed rows, which may be longer than the table) are checked one by one.
  if (positions.data != nullptr) return check_positions(op, x, table, position_offset, positions);
  check_that(position_offset >= 0 && position_offset + x.shape[1] <= table.max_positions,
             "{}: positions [{}, {}) exceed the table's {} positions", op, position_offset,
             position_offset + x.shape[1], table.max_positions);
}

RopeTable make_rope_table(int64_t head_dim, int64_t max_positions, double theta, const RopeScalingParams& scaling) {
  if (head_dim <= 0 || head_dim % 2 != 0) fail("rope: head_dim must be a positive even number, got {}", head_dim);
  if (max_positions <= 0) fail("rope: max_position_embeddings must be positive, got {}", max_positions);
  if (!(theta > 1.0)) fail("rope: rope_theta must be greater than 1, got {}", theta);

  RopeTable table;
  table.head_dim = head_dim;
  table.max_positions = max_positions;
  table.inv_freq = default_inv_freq(head_dim, theta);
  if (scaling.type == RopeScalingParams::Type::Llama3) apply_llama3_scaling(table.inv_freq, scaling);

  table.cos = Tensor::empty(Shape{max_positions, head_dim}, DType::F32);
  table.sin = Tensor::empty(Shape{max_positions, head_dim}, DType::F32);
  float* cos_out = table.cos.data<float>();
  float* sin_out = table.sin.data<float>();
  const int64_t half = head_dim / 2;
  for (int64_t p = 0; p < max_positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      // freqs = position (fp32) * inv_freq in fp32, as HF's fp32 outer product.
      const float angle = static_cast<float>(p) * table.inv_freq[static_cast<size_t>(i)];
      const float c = std::cos(angle), s = std::sin(angle);
      cos_out[p * head_dim + i] = cos_out[p * head_dim + i + half] = c;
      sin_out[p * head_dim + i] = sin_out[p * head_dim + i + half] = s;
    }
  return table;
}

void rope_forward(TensorView x, const RopeTable& table, int64_t position_offset, const TensorView& positions) {
  rope_apply(x, table, position_offset, positions, 1.0f, "rope_forward");
}

void rope_backward(TensorView dx, const RopeTable& table, int64_t position_offset, const TensorView& positions) {
  rope_apply(dx, table, position_offset, positions, -1.0f, "rope_backward");
}

}  // namespace fsdpq
