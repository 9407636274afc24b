#include "ops/dora.h"

#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/parallel.h"
#include "ops/storage.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>

namespace fsdpq {
namespace {

bool dropout_active(const LoraParams& params) { return params.training && params.dropout > 0.0f; }

void check_f32_vector(const char* op, const char* name, const TensorView& view, int64_t n) {
  check_that(view.dtype == DType::F32 && view.numel() == n, "{}: {} is {}; expected F32 with {} elements", op, name,
             view.describe(), n);
}

struct DoraDims {
  int64_t rows, in, out, rank;
};

// The site's and saved tensors' shapes agree with x; every operand on one device.
DoraDims check_dora(const char* op, const TensorView& x, const DoraSaved& saved, const DoraSite& site) {
  check_float(op, "x", x);
  check_float(op, "W", site.W);
  check_float(op, "A", site.A);
  check_float(op, "B", site.B);
  check_float(op, "magnitude", site.magnitude);
  check_float(op, "xa", saved.xa);
  check_float(op, "z", saved.z);
  runs_on_cuda(op, {x, site.W, site.A, site.B, site.magnitude, saved.xa, saved.z, saved.norm});
  check_that(site.W.shape.rank == 2 && site.A.shape.rank == 2 && site.B.shape.rank == 2,
             "{}: W {}, A {} and B {} must be matrices", op, site.W.shape.to_string(), site.A.shape.to_string(),
             site.B.shape.to_string());
  const DoraDims d{x.shape.rows(), site.W.shape[1], site.W.shape[0], site.A.shape[0]};
  check_that(x.shape.last() == d.in && site.A.shape[1] == d.in && site.B.shape == Shape{d.out, d.rank},
             "{}: x {}, W {} [out, in], A {} [r, in] and B {} [out, r] do not fit together", op, x.shape.to_string(),
             site.W.shape.to_string(), site.A.shape.to_string(), site.B.shape.to_string());
  check_numel(op, "magnitude", site.magnitude, d.out);
  check_f32_vector(op, "norm", saved.norm, d.out);
  check_shape(op, "xa", saved.xa, Shape{d.rows, d.rank});
  check_that(saved.z.shape.rows() == d.rows && saved.z.shape.last() == d.out, "{}: z {} must be [{}, {}]", op,
             saved.z.shape.to_string(), d.rows, d.out);
  return d;
}

// g = m / n, on the operands' device.
Tensor magnitude_scale(const DoraSite& site, const TensorView& norm) {
  Tensor g = Tensor::empty(Shape{norm.numel()}, DType::F32, norm.device);
  dora_magnitude_scale(g, site.magnitude, norm);
  return g;
}

GpuDoraNorm& gpu_dora_norm_choice() {
  static GpuDoraNorm choice = [] {
    const char* env = std::getenv("FSDPQ_DORA_NORM");  // runtime/environment.cpp checks the value
    return env != nullptr && std::string_view(env) == "expanded" ? GpuDoraNorm::Expanded : GpuDoraNorm::Direct;
  }();
  return choice;
}

// dora_weight_norm's operands (either form): float W [out, in], A [r, in], B [out, r] on one device,
// norm F32 [out].
void check_weight_norm(const TensorView& norm, const TensorView& W, const TensorView& A, const TensorView& B) {
  constexpr const char* op = "dora_weight_norm";
  check_float(op, "W", W);
  check_float(op, "A", A);
  check_float(op, "B", B);
  runs_on_cuda(op, {norm, W, A, B});
  check_that(W.shape.rank == 2 && A.shape.rank == 2 && B.shape.rank == 2 && A.shape[1] == W.shape[1] &&
                 B.shape == Shape{W.shape[0], A.shape[0]},
             "{}: W {} [out, in], A {} [r, in] and B {} [out, r] do not fit together", op, W.shape.to_string(),
             A.shape.to_string(), B.shape.to_string());
  check_f32_vector(op, "norm", norm, W.shape[0]);
}

}  // namespace

int64_t dora_norm_chunk_rows(int64_t out, int64_t in) {
  return std::clamp<int64_t>(kDoraNormChunkBytes / (4 * std::max<int64_t>(in, 1)), 1, std::max<int64_t>(out, 1));
}

GpuDoraNorm gpu_dora_norm() { return gpu_dora_norm_choice(); }
void set_gpu_dora_norm(GpuDoraNorm norm) { gpu_dora_norm_choice() = norm; }

void dora_weight_norm_expanded(TensorView norm, const TensorView& W, const TensorView& A, const TensorView& B,
                               float scaling) {
  check_weight_norm(norm, W, A, B);
  const int64_t out = W.shape[0], r = A.shape[0];
  Tensor G = Tensor::empty(Shape{out, r}, DType::F32, W.device);
  linear_forward(G, W, A);  // G = W·Aᵀ: W's one large read
  // M = A·Aᵀ and H = B·M (M is symmetric: B·Mᵀ) in fp32 operands, so the s² term is not rounded
  // to 16 bits on the GPU; both are [r, ·]-sized.
  Tensor A32 = Tensor::empty(A.shape, DType::F32, A.device), B32 = Tensor::empty(B.shape, DType::F32, B.device);
  copy_convert(A32, A);
  copy_convert(B32, B);
  Tensor M = Tensor::empty(Shape{r, r}, DType::F32, W.device), H = Tensor::empty(Shape{out, r}, DType::F32, W.device);
  linear_forward(M, A32, A32);
  linear_forward(H, B32, M);
  dora_norm_from_parts(norm, W, B32, G, H, scaling);
}

void dora_weight_norm(TensorView norm, const TensorView& W, const TensorView& A, const TensorView& B, float scaling) {
  if (W.device == Device::CUDA && gpu_dora_norm() == GpuDoraNorm::Expanded)
    return dora_weight_norm_expanded(norm, W, A, B, scaling);
  check_weight_norm(norm, W, A, B);
  const int64_t out = W.shape[0], in = W.shape[1];
  const int64_t chunk = dora_norm_chunk_rows(out, in);
  Tensor scratch = Tensor::empty(Shape{chunk, in}, DType::F32, W.device);
  for (int64_t first = 0; first < out; first += chunk) {
    const int64_t rows = std::min(chunk, out - first);
    const TensorView P = scratch.view().slice_rows(0, rows);
    copy_convert(P, W.slice_rows(first, rows));
    linear_backward_input(P, B.slice_rows(first, rows), A, /*accumulate=*/true, scaling);  // P += s·B·A
    dora_row_norms(norm.slice_rows(first, rows), P);
  }
}

void dora_forward(TensorView y, const DoraSaved& saved, const TensorView& x, const DoraSite& site) {
  constexpr const char* op = "dora_forward";
  const DoraDims d = check_dora(op, x, saved, site);
  check_float(op, "y", y);
  check_that(y.shape.rows() == d.rows && y.shape.last() == d.out, "{}: y {} must be [{}, {}]", op,
             y.shape.to_string(), d.rows, d.out);
  const Tensor g = magnitude_scale(site, saved.norm);
  if (!dropout_active(site.params)) {
    // PEFT reuses the base output: y = g ⊙ (x·Wᵀ + s·x·Aᵀ·Bᵀ).
    linear_forward(saved.z, x, site.W);
    lora_forward(saved.z, saved.xa, x, site.A, site.B, site.params);
    dora_scale_columns(y, saved.z, g, 0.0f, /*accumulate=*/false);
    return;
  }
  // y = x·Wᵀ − x'·Wᵀ + g ⊙ z with z = x'·Wᵀ + s·x'·Aᵀ·Bᵀ: PEFT's base output plus its
  // (g − 1) ⊙ x'·Wᵀ + g ⊙ s·x'·Aᵀ·Bᵀ. lora_forward draws the same x' from the same key.
  linear_forward(y, x, site.W);
  {
    Tensor dropped = Tensor::empty(x.shape, x.dtype, x.device);
    lora_dropout_forward(dropped, x, site.params);
    linear_forward(saved.z, dropped, site.W);
  }
  add_scaled(y, saved.z, -1.0f);
  lora_forward(saved.z, saved.xa, x, site.A, site.B, site.params);
  dora_scale_columns(y, saved.z, g, 0.0f, /*accumulate=*/true);
}

void dora_backward(TensorView dx, bool accumulate_dx, TensorView dA, TensorView dB, TensorView dm,
                   const TensorView& dy, const TensorView& x, const DoraSaved& saved, const DoraSite& site) {
  constexpr const char* op = "dora_backward";
  const DoraDims d = check_dora(op, x, saved, site);
  check_float(op, "dy", dy);
  check_that(dy.shape.rows() == d.rows && dy.shape.last() == d.out, "{}: dy {} must be [{}, {}]", op,
             dy.shape.to_string(), d.rows, d.out);
  check_f32_vector(op, "dm", dm, d.out);
  runs_on_cuda(op, {dx, dA, dB, dm, dy, x});
  const Tensor g = magnitude_scale(site, saved.norm);
  dora_magnitude_backward(dm, dy, saved.z, saved.norm);
  // Everything that went through z arrives scaled by g.
  Tensor dy_g = Tensor::empty(dy.shape, dy.dtype, dy.device);
  dora_scale_columns(dy_g, dy, g, 0.0f, /*accumulate=*/false);
  if (dx.data != nullptr) {
    if (!dropout_active(site.params)) {
      linear_backward_input(dx, dy_g, site.W, accumulate_dx);
    } else {
      // The base path sees dy; the dropped input's base path (g − 1) ⊙ dy, through the mask.
      linear_backward_input(dx, dy, site.W, accumulate_dx);
      Tensor dy_minus = Tensor::empty(dy.shape, dy.dtype, dy.device);
      dora_scale_columns(dy_minus, dy, g, -1.0f, /*accumulate=*/false);
      Tensor d_dropped = Tensor::empty(Shape{d.rows, d.in}, DType::F32, dy.device);
      linear_backward_input(d_dropped, dy_minus, site.W);
      lora_dropout_backward(dx, d_dropped, site.params);
    }
  }
  lora_backward(dx, dA, dB, dy_g, x, saved.xa, site.A, site.B, site.params);
}

void dora_norm_from_parts(TensorView norm, const TensorView& W, const TensorView& B, const TensorView& G,
                          const TensorView& H, float scaling) {
  constexpr const char* op = "dora_norm_from_parts";
  check_float(op, "W", W);
  check_float(op, "B", B);
  check_dtype(op, "G", G, DType::F32);
  check_dtype(op, "H", H, DType::F32);
  check_that(W.shape.rank == 2 && B.shape.rank == 2 && B.shape[0] == W.shape[0] && G.shape == B.shape &&
                 H.shape == B.shape,
             "{}: W {} [out, in], B {}, G {} and H {} [out, r] do not fit together", op, W.shape.to_string(),
             B.shape.to_string(), G.shape.to_string(), H.shape.to_string());
  const int64_t out = W.shape[0], in = W.shape[1], r = B.shape[1];
  check_f32_vector(op, "norm", norm, out);
  if (runs_on_cuda(op, {norm, W, B, G, H}))
    if constexpr (kWithCuda) return cuda_ops::dora_norm_from_parts(norm, W, B, G, H, scaling);
  Tensor w32 = Tensor::empty(W.shape, DType::F32, Device::CPU), b32 = Tensor::empty(B.shape, DType::F32, Device::CPU);
  copy_convert(w32, W);
  copy_convert(b32, B);
  const float* w = w32.view().as<const float>();
  const float* b = b32.view().as<const float>();
  const float* g = G.as<const float>();
  const float* h = H.as<const float>();
  float* n = norm.as<float>();
  const double two_s = 2.0 * scaling, s2 = static_cast<double>(scaling) * scaling;
#pragma omp parallel for if (worth_parallel(out * in)) schedule(static)
  for (int64_t o = 0; o < out; ++o) {
    double sum = 0.0;  // one row in a fixed order: the same bits at any thread count
    for (int64_t j = 0; j < in; ++j) sum += static_cast<double>(w[o * in + j]) * w[o * in + j];
    for (int64_t k = 0; k < r; ++k) sum += b[o * r + k] * (two_s * g[o * r + k] + s2 * h[o * r + k]);
    n[o] = static_cast<float>(std::sqrt(std::max(sum, 0.0)));
  }
}

void dora_row_norms(TensorView norm, const TensorView& P) {
  constexpr const char* op = "dora_row_norms";
  check_dtype(op, "P", P, DType::F32);
  check_that(P.shape.rank == 2, "{}: P {} must be a matrix", op, P.describe());
  const int64_t rows = P.shape[0], in = P.shape[1];
  check_f32_vector(op, "norm", norm, rows);
  if (runs_on_cuda(op, {norm, P}))
    if constexpr (kWithCuda) return cuda_ops::dora_row_norms(norm, P);
  check_cpu_dtype(op, "P", P, DType::F32);
  const float* p = P.as<const float>();
  float* n = norm.as<float>();
#pragma omp parallel for if (worth_parallel(rows * in)) schedule(static)
  for (int64_t i = 0; i < rows; ++i) {
    double sum = 0.0;  // one row in a fixed order: the same bits at any thread count
    for (int64_t k = 0; k < in; ++k) sum += static_cast<double>(p[i * in + k]) * p[i * in + k];
    n[i] = static_cast<float>(std::sqrt(sum));
  }
}

void dora_magnitude_scale(TensorView g, const TensorView& magnitude, const TensorView& norm) {
  constexpr const char* op = "dora_magnitude_scale";
  check_float(op, "magnitude", magnitude);
  const int64_t out = magnitude.numel();
  check_f32_vector(op, "g", g, out);
  check_f32_vector(op, "norm", norm, out);
  if (runs_on_cuda(op, {g, magnitude, norm}))
    if constexpr (kWithCuda) return cuda_ops::dora_magnitude_scale(g, magnitude, norm);
  with_storage(magnitude.dtype, op, [&](auto tag) {
    using M = decltype(tag);
    const M* m = magnitude.as<const M>();
    const float* n = norm.as<const float>();
    float* out_g = g.as<float>();
    for (int64_t j = 0; j < out; ++j) out_g[j] = to_f32(m[j]) / n[j];
  });
}

void dora_scale_columns(TensorView out, const TensorView& in, const TensorView& g, float offset, bool accumulate) {
  constexpr const char* op = "dora_scale_columns";
  check_float(op, "out", out);
  check_float(op, "in", in);
  const int64_t cols = in.shape.last(), rows = in.shape.rows();
  check_that(out.shape.rows() == rows && out.shape.last() == cols, "{}: out {} and in {} differ", op,
             out.shape.to_string(), in.shape.to_string());
  check_f32_vector(op, "g", g, cols);
  if (runs_on_cuda(op, {out, in, g}))
    if constexpr (kWithCuda) return cuda_ops::dora_scale_columns(out, in, g, offset, accumulate);
  const float* scale = g.as<const float>();
  with_storages({in.dtype, out.dtype}, op, [&](auto in_tag, auto out_tag) {
    using I = decltype(in_tag);
    using O = decltype(out_tag);
    const I* src = in.as<const I>();
    O* dst = out.as<O>();
#pragma omp parallel for if (worth_parallel(rows * cols)) schedule(static)
    for (int64_t t = 0; t < rows; ++t)
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t e = t * cols + j;
        const float scaled = to_f32(src[e]) * (scale[j] + offset);
        dst[e] = from_f32<O>(accumulate ? to_f32(dst[e]) + scaled : scaled);
      }
  });
}

void dora_magnitude_backward(TensorView dm, const TensorView& dy, const TensorView& z, const TensorView& norm) {
  constexpr const char* op = "dora_magnitude_backward";
  check_float(op, "dy", dy);
  check_float(op, "z", z);
  const int64_t cols = dy.shape.last(), rows = dy.shape.rows();
  check_that(z.shape.rows() == rows && z.shape.last() == cols, "{}: dy {} and z {} differ", op, dy.shape.to_string(),
             z.shape.to_string());
  check_f32_vector(op, "dm", dm, cols);
  check_f32_vector(op, "norm", norm, cols);
  if (runs_on_cuda(op, {dm, dy, z, norm}))
    if constexpr (kWithCuda) return cuda_ops::dora_magnitude_backward(dm, dy, z, norm);
  const float* n = norm.as<const float>();
  float* out = dm.as<float>();
  with_storages({dy.dtype, z.dtype}, op, [&](auto dy_tag, auto z_tag) {
    using D = decltype(dy_tag);
    using Z = decltype(z_tag);
    const D* g = dy.as<const D>();
    const Z* v = z.as<const Z>();
#pragma omp parallel for if (worth_parallel(rows * cols)) schedule(static)
    for (int64_t j = 0; j < cols; ++j) {
      float sum = 0.0f;  // fp32, rows in order, as the kernel's columns are summed
      for (int64_t t = 0; t < rows; ++t) sum += to_f32(g[t * cols + j]) * to_f32(v[t * cols + j]);
      out[j] += sum / n[j];
    }
  });
}

}  // namespace fsdpq
