#include "ops/attention.h"

#include "backend/section_times.h"
#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/parallel.h"
#include "ops/storage.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <cstdlib>

namespace fsdpq {

namespace {

struct AttentionDims {
  int64_t B, T, H, KV, D;
  int64_t group() const { return H / KV; }
};

AttentionDims check_dims(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& lse) {
  check_float(op, "q", q);
  check_float(op, "k", k);
  check_float(op, "v", v);
  check_that(lse.dtype == DType::F32, "{}: lse is {}; expected F32", op, lse.describe());
  check_that(q.shape.rank == 4 && k.shape.rank == 4, "{}: q {} and k {} must be [B, T, heads, D]", op,
             q.shape.to_string(), k.shape.to_string());
  AttentionDims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  check_that(d.KV > 0 && d.H % d.KV == 0, "{}: query heads {} must be a multiple of kv heads {}", op, d.H, d.KV);
  check_shape(op, "k", k, Shape{d.B, d.T, d.KV, d.D});
  check_shape(op, "v", v, Shape{d.B, d.T, d.KV, d.D});
  check_shape(op, "lse", lse, Shape{d.B, d.H, d.T});
  return d;
}

// segment_start (attention.h): I32 [B, T] on the operands' device; on the CPU its values are
// checked too (0 <= start <= position), since a bad one would read keys outside the row.
void check_segment_start(const char* op, const TensorView& segment_start, const AttentionDims& d) {
  if (segment_start.data == nullptr) return;
  check_dtype(op, "segment_start", segment_start, DType::I32);
  check_shape(op, "segment_start", segment_start, Shape{d.B, d.T});
  if (segment_start.device != Device::CPU) return;
  const int32_t* start = segment_start.as<const int32_t>();
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t = 0; t < d.T; ++t) {
      const int32_t s = start[b * d.T + t];
      check_that(s >= 0 && s <= t, "{}: segment_start[{}, {}] is {}; expected a start in [0, {}]", op, b, t, s, t);
    }
}

// The first key query t of row b sees: its example's start, or 0 without segments.
inline int64_t first_visible_key(const int32_t* segment_start, int64_t b, int64_t t, int64_t T) {
  return segment_start != nullptr ? segment_start[b * T + t] : 0;
}

GpuAttentionKernels& gpu_attention_choice() {
  static GpuAttentionKernels choice = [] {
    const char* env = std::getenv("FSDPQ_ATTENTION");
    const std::string v = env != nullptr ? env : "";
    if (v == "mma") return GpuAttentionKernels::TensorCores;
    if (v == "simt") return GpuAttentionKernels::Simt;
    if (v == "cudnn") return GpuAttentionKernels::Cudnn;
    if (v == "cudnn-nondeterministic") return GpuAttentionKernels::CudnnNondeterministic;
    if (v == "wgmma") return GpuAttentionKernels::Wgmma;
    return GpuAttentionKernels::Auto;  // unset or "auto" (runtime/environment.cpp refuses other values)
  }();
  return choice;
}

// The math runs on contiguous fp32 [T, D] panels of one head; converting a whole panel at a time
// keeps the dtype switch out of the inner loops.
template <class S>
void gather_typed(float* panel, const TensorView& x, int64_t b, int64_t head) {
  const int64_t T = x.shape[1], heads = x.shape[2], D = x.shape[3];
  const S* src = x.as<const S>();
  for (int64_t t = 0; t < T; ++t) {
    const S* row = src + ((b * T + t) * heads + head) * D;
    for (int64_t i = 0; i < D; ++i) panel[t * D + i] = to_f32(row[i]);
  }
}

template <class S>
void scatter_typed(const TensorView& x, const float* panel, int64_t b, int64_t head) {
  const int64_t T = x.shape[1], heads = x.shape[2], D = x.shape[3];
  S* dst = x.as<S>();
  for (int64_t t = 0; t < T; ++t) {
    S* row = dst + ((b * T + t) * heads + head) * D;
    for (int64_t i = 0; i < D; ++i) row[i] = from_f32<S>(panel[t * D + i]);
  }
}

// Head `head` of batch b of a [B, T, heads, D] tensor, as fp32 [T, D]. dtype is checked beforehand.
void gather_head(std::vector<float>& panel, const TensorView& x, int64_t b, int64_t head) {
  panel.resize(static_cast<size_t>(x.shape[1] * x.shape[3]));
  with_storage(x.dtype, "attention", [&](auto tag) { gather_typed<decltype(tag)>(panel.data(), x, b, head); });
}

void scatter_head(const TensorView& x, const std::vector<float>& panel, int64_t b, int64_t head) {
  with_storage(x.dtype, "attention", [&](auto tag) { scatter_typed<decltype(tag)>(x, panel.data(), b, head); });
}

inline float dot(const float* a, const float* b, int64_t n) {
  float partial[4] = {};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int lane = 0; lane < 4; ++lane) partial[lane] += a[i + lane] * b[i + lane];
  for (; i < n; ++i) partial[0] += a[i] * b[i];
  return (partial[0] + partial[1]) + (partial[2] + partial[3]);
}

inline void add_scaled(float* y, const float* x, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += scale * x[i];
}

}  // namespace

void attention_forward(TensorView out, TensorView lse, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& segment_start) {
  constexpr const char* op = "attention_forward";
  const AttentionDims d = check_dims(op, q, k, v, lse);
  check_float(op, "out", out);
  check_shape(op, "out", out, q.shape);
  check_segment_start(op, segment_start, d);
  if (runs_on_cuda(op, {out, lse, q, k, v, segment_start}))
    if constexpr (kWithCuda) return cuda_ops::attention_forward(out, lse, q, k, v, segment_start);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  float* lse_out = lse.as<float>();
  const int32_t* starts = segment_start.data != nullptr ? segment_start.as<const int32_t>() : nullptr;

#pragma omp parallel if (worth_parallel(d.B * d.H * d.T * d.T * d.D))
  {
    std::vector<float> qp, kp, vp, o_panel, scores(static_cast<size_t>(d.T));
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t h = 0; h < d.H; ++h) {
        const int64_t kv = h / d.group();
        gather_head(qp, q, b, h);
        gather_head(kp, k, b, kv);
        gather_head(vp, v, b, kv);
        o_panel.assign(static_cast<size_t>(d.T * d.D), 0.0f);
        for (int64_t t = 0; t < d.T; ++t) {
          const float* q_row = qp.data() + t * d.D;
          const int64_t first = first_visible_key(starts, b, t, d.T);
          float max_score = -std::numeric_limits<float>::infinity();
          for (int64_t j = first; j <= t; ++j) {  // causal within the example: keys first..t
            scores[static_cast<size_t>(j)] = dot(q_row, kp.data() + j * d.D, d.D) * scale;
            max_score = std::max(max_score, scores[static_cast<size_t>(j)]);
          }
          float sum = 0.0f;
          for (int64_t j = first; j <= t; ++j) {
            float& s = scores[static_cast<size_t>(j)];
            s = std::exp(s - max_score);
            sum += s;
          }
          float* o_row = o_panel.data() + t * d.D;
          const float inv_sum = 1.0f / sum;
          for (int64_t j = first; j <= t; ++j)
            add_scaled(o_row, vp.data() + j * d.D, scores[static_cast<size_t>(j)] * inv_sum, d.D);
          lse_out[(b * d.H + h) * d.T + t] = max_score + std::log(sum);
        }
        scatter_head(out, o_panel, b, h);
      }
  }
}

namespace {

// The backward's arguments, as attention_backward and attention_rope_backward take them.
AttentionDims check_backward(const char* op, const TensorView& dq, const TensorView& dk, const TensorView& dv,
                             const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& lse, const TensorView& segment_start) {
  const AttentionDims d = check_dims(op, q, k, v, lse);
  check_float(op, "out", out);
  check_float(op, "dout", dout);
  check_float(op, "dq", dq);
  check_float(op, "dk", dk);
  check_float(op, "dv", dv);
  check_shape(op, "out", out, q.shape);
  check_shape(op, "dout", dout, q.shape);
  check_shape(op, "dq", dq, q.shape);
  check_shape(op, "dk", dk, k.shape);
  check_shape(op, "dv", dv, v.shape);
  check_segment_start(op, segment_start, d);
  return d;
}

}  // namespace

void attention_rope_backward(TensorView dq, TensorView dk, TensorView dv, const TensorView& dout, const TensorView& q,
                             const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
                             const RopeTable& rope, int64_t position_offset, const TensorView& positions,
                             const TensorView& segment_start) {
  constexpr const char* op = "attention_rope_backward";
  check_backward(op, dq, dk, dv, dout, q, k, v, out, lse, segment_start);
  check_rope_arguments(op, dq, rope, position_offset, positions);
  check_rope_arguments(op, dk, rope, position_offset, positions);
  bool rotated = false;  // by the kernels, as they stored dq and dk
  if (runs_on_cuda(op, {dq, dk, dv, dout, q, k, v, out, lse, segment_start, positions})) {
    if constexpr (kWithCuda)
      rotated = cuda_ops::attention_rope_backward(dq, dk, dv, dout, q, k, v, out, lse, segment_start, rope,
                                                  position_offset, positions);
  } else {
    attention_backward(dq, dk, dv, dout, q, k, v, out, lse, segment_start);
  }
  if (rotated) return;
  const ScopedSection section("rope bwd");
  rope_backward(dq, rope, position_offset, positions);
  rope_backward(dk, rope, position_offset, positions);
}

void attention_backward(TensorView dq, TensorView dk, TensorView dv, const TensorView& dout, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
                        const TensorView& segment_start) {
  constexpr const char* op = "attention_backward";
  const AttentionDims d = check_backward(op, dq, dk, dv, dout, q, k, v, out, lse, segment_start);
  if (runs_on_cuda(op, {dq, dk, dv, dout, q, k, v, out, lse, segment_start}))
    if constexpr (kWithCuda) return cuda_ops::attention_backward(dq, dk, dv, dout, q, k, v, out, lse, segment_start);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d.D));
  const float* lse_in = lse.as<const float>();
  const int32_t* starts = segment_start.data != nullptr ? segment_start.as<const int32_t>() : nullptr;

  // One task per (b, kv head): it owns dk/dv of that head and dq of the query heads of its group,
  // so no two threads write the same gradient and every sum keeps a fixed order.
#pragma omp parallel if (worth_parallel(d.B * d.H * d.T * d.T * d.D))
  {
    std::vector<float> qp, kp, vp, o_panel, do_panel, dq_panel, dk_panel, dv_panel;
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t kv = 0; kv < d.KV; ++kv) {
        gather_head(kp, k, b, kv);
        gather_head(vp, v, b, kv);
        dk_panel.assign(static_cast<size_t>(d.T * d.D), 0.0f);
        dv_panel.assign(static_cast<size_t>(d.T * d.D), 0.0f);
        for (int64_t h = kv * d.group(); h < (kv + 1) * d.group(); ++h) {
          gather_head(qp, q, b, h);
          gather_head(o_panel, out, b, h);
          gather_head(do_panel, dout, b, h);
          dq_panel.assign(static_cast<size_t>(d.T * d.D), 0.0f);
          const float* lse_row = lse_in + (b * d.H + h) * d.T;
          for (int64_t t = 0; t < d.T; ++t) {
            const float* q_row = qp.data() + t * d.D;
            const float* do_row = do_panel.data() + t * d.D;
            float* dq_row = dq_panel.data() + t * d.D;
            // With P = softmax(S): dS_tj = P_tj * (dO_t . V_j - dO_t . O_t).
            const float do_dot_o = dot(do_row, o_panel.data() + t * d.D, d.D);
            for (int64_t j = first_visible_key(starts, b, t, d.T); j <= t; ++j) {
              const float* k_row = kp.data() + j * d.D;
              const float p = std::exp(dot(q_row, k_row, d.D) * scale - lse_row[t]);
              const float dp = dot(do_row, vp.data() + j * d.D, d.D);
              const float ds = p * (dp - do_dot_o) * scale;
              add_scaled(dq_row, k_row, ds, d.D);
              add_scaled(dk_panel.data() + j * d.D, q_row, ds, d.D);
              add_scaled(dv_panel.data() + j * d.D, do_row, p, d.D);
            }
          }
          scatter_head(dq, dq_panel, b, h);
        }
        scatter_head(dk, dk_panel, b, kv);
        scatter_head(dv, dv_panel, b, kv);
      }
  }
}

GpuAttentionKernels gpu_attention_kernels() { return gpu_attention_choice(); }
void set_gpu_attention_kernels(GpuAttentionKernels kernels) { gpu_attention_choice() = kernels; }

}  // namespace fsdpq
