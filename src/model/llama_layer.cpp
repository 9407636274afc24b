#include "model/llama_layer.h"

#include "backend/section_times.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu.h"

namespace fsdpq {
namespace {

Shape heads_shape(const LayerDims& d, int64_t heads) { return Shape{d.B, d.T, heads, d.D}; }

// y = x·Wᵀ (+ scaling · dropout(x)·Aᵀ·Bᵀ), keeping xa for the backward.
void linear_lora_forward(TensorView y, const TensorView& x, int m, const LayerCompute& w, LayerActivations& a) {
  {
    ScopedSection section("linear");
    linear_forward(y, x, w.weight[m]);
  }
  if (const LoraAdapter* lora = w.lora[m]) {
    ScopedSection section("lora");
    lora_forward(y, a.xa[m], x, lora->A.compute_view(), lora->B.compute_view(), w.lora_params[m]);
  }
}

// The GPU multiplies an fp32 activation gradient in the weights' 16-bit type (ops/matmul.cpp);
// the three or four GEMMs that read dy then share one rounded copy instead of rounding it each.
// The same bits as rounding per GEMM; the CPU computes in fp32 and keeps dy as it is.
TensorView gemm_ready(const TensorView& dy, int m, const LayerCompute& w, Tensor& storage) {
  const DType half = w.weight[m].dtype;
  if (dy.device == Device::CPU || dy.dtype != DType::F32 || (half != DType::BF16 && half != DType::F16)) return dy;
  if (const LoraAdapter* lora = w.lora[m])
    if (lora->B.compute_view().dtype != half) return dy;  // the adapter's GEMMs round to another type
  ScopedSection section("dy rounding");
  storage = Tensor::empty(dy.shape, half, dy.device);
  copy_convert(storage, dy);
  return storage.view();
}

// dx (+)= dy·W (+ the adapter's part); adds dW for a trainable base weight and dA, dB for an adapter.
void linear_lora_backward(TensorView dx, bool accumulate, const TensorView& dy_f32, const TensorView& x, int m,
                          const LayerCompute& w, const LayerActivations& a) {
  Tensor dy_storage;
  const TensorView dy = gemm_ready(dy_f32, m, w, dy_storage);
  {
    ScopedSection section("linear bwd");
    linear_backward_input(dx, dy, w.weight[m], accumulate);
    if (w.d_weight[m].data) linear_backward_weight(w.d_weight[m], dy, x, /*accumulate=*/true);
  }
  if (const LoraAdapter* lora = w.lora[m]) {
    ScopedSection section("lora bwd");
    lora_backward(dx, lora->A.grad.view(), lora->B.grad.view(), dy, x, a.xa[m], lora->A.compute_view(),
                  lora->B.compute_view(), w.lora_params[m]);
  }
}

}  // namespace

LayerDims layer_dims(const LlamaConfig& config, int64_t batch, int64_t seq_len) {
  LayerDims d;
  d.B = batch;
  d.T = seq_len;
  d.C = config.hidden_size;
  d.H = config.num_attention_heads;
  d.KV = config.num_key_value_heads;
  d.D = config.head_dim;
  d.I = config.intermediate_size;
  d.eps = static_cast<float>(config.rms_norm_eps);
  return d;
}

void LayerActivations::allocate(const LayerDims& d, DType dtype, const std::array<int64_t, kLinearModules>& lora_ranks,
                                Device device) {
  const int64_t N = d.N();
  n1 = Tensor::empty(Shape{N, d.C}, dtype, device);
  rstd1 = Tensor::empty(Shape{N}, DType::F32, device);
  q = Tensor::empty(Shape{N, d.H * d.D}, dtype, device);
  k = Tensor::empty(Shape{N, d.KV * d.D}, dtype, device);
  v = Tensor::empty(Shape{N, d.KV * d.D}, dtype, device);
  att = Tensor::empty(Shape{N, d.H * d.D}, dtype, device);
  lse = Tensor::empty(Shape{d.B, d.H, d.T}, DType::F32, device);
  x2 = Tensor::empty(Shape{N, d.C}, dtype, device);
  n2 = Tensor::empty(Shape{N, d.C}, dtype, device);
  rstd2 = Tensor::empty(Shape{N}, DType::F32, device);
  gate = Tensor::empty(Shape{N, d.I}, dtype, device);
  up = Tensor::empty(Shape{N, d.I}, dtype, device);
  h = Tensor::empty(Shape{N, d.I}, dtype, device);
  for (int m = 0; m < kLinearModules; ++m)
    xa[m] = lora_ranks[m] > 0 ? Tensor::empty(Shape{N, lora_ranks[m]}, dtype, device) : Tensor();
}

int64_t LayerActivations::nbytes() const {
  size_t total = 0;
  for (const Tensor* t : {&n1, &rstd1, &q, &k, &v, &att, &lse, &x2, &n2, &rstd2, &gate, &up, &h}) total += t->nbytes();
  for (const Tensor& t : xa)
    if (t.defined()) total += t.nbytes();  // an absent adapter's empty Tensor has rank 0, numel 1
  return static_cast<int64_t>(total);
}

void LayerGradScratch::allocate(const LayerDims& d, Device device) {
  const int64_t N = d.N();
  d_norm = Tensor::empty(Shape{N, d.C}, DType::F32, device);
  d_att = Tensor::empty(Shape{N, d.H * d.D}, DType::F32, device);
  dq = Tensor::empty(Shape{N, d.H * d.D}, DType::F32, device);
  dk = Tensor::empty(Shape{N, d.KV * d.D}, DType::F32, device);
  dv = Tensor::empty(Shape{N, d.KV * d.D}, DType::F32, device);
  dh = Tensor::empty(Shape{N, d.I}, DType::F32, device);
  dgate = Tensor::empty(Shape{N, d.I}, DType::F32, device);
  dup = Tensor::empty(Shape{N, d.I}, DType::F32, device);
  norm_weight_sink = Tensor::zeros(Shape{d.C}, DType::F32, device);
}

void attention_inputs_forward(LayerActivations& a, const TensorView& x, const LayerCompute& w, const LayerDims& d,
                              const RopeTable& rope, int64_t position_offset) {
  {
    ScopedSection section("rmsnorm");
    rmsnorm_forward(a.n1, a.rstd1, x, w.input_norm, d.eps);
  }
  linear_lora_forward(a.q, a.n1, kQProj, w, a);
  linear_lora_forward(a.k, a.n1, kKProj, w, a);
  linear_lora_forward(a.v, a.n1, kVProj, w, a);
  ScopedSection section("rope");
  rope_forward(a.q.view().reshaped(heads_shape(d, d.H)), rope, position_offset);
  rope_forward(a.k.view().reshaped(heads_shape(d, d.KV)), rope, position_offset);
}

void attention_output_mlp_forward(TensorView out, LayerActivations& a, const TensorView& x, const LayerCompute& w,
                                  const LayerDims& d) {
  // o_proj lands in x2, then the residual is added in place (each rounded once, as HF does).
  linear_lora_forward(a.x2, a.att, kOProj, w, a);
  {
    ScopedSection section("residual + rmsnorm");
    residual_add(a.x2, x, a.x2);
    rmsnorm_forward(a.n2, a.rstd2, a.x2, w.post_norm, d.eps);
  }
  linear_lora_forward(a.gate, a.n2, kGateProj, w, a);
  linear_lora_forward(a.up, a.n2, kUpProj, w, a);
  {
    ScopedSection section("swiglu");
    swiglu_forward(a.h, a.gate, a.up);
  }
  linear_lora_forward(out, a.h, kDownProj, w, a);
  ScopedSection section("residual + rmsnorm");
  residual_add(out, a.x2, out);
}

void layer_forward(TensorView out, LayerActivations& a, const TensorView& x, const LayerCompute& w,
                   const LayerDims& d, const RopeTable& rope) {
  attention_inputs_forward(a, x, w, d, rope, 0);
  {
    ScopedSection section("attention");
    attention_forward(a.att.view().reshaped(heads_shape(d, d.H)), a.lse, a.q.view().reshaped(heads_shape(d, d.H)),
                      a.k.view().reshaped(heads_shape(d, d.KV)), a.v.view().reshaped(heads_shape(d, d.KV)));
  }
  attention_output_mlp_forward(out, a, x, w, d);
}

void layer_backward(TensorView d_resid, LayerGradScratch& s, const LayerActivations& a, const TensorView& x,
                    const LayerCompute& w, const LayerDims& d, const RopeTable& rope) {
  // MLP: out = x2 + down(h), h = silu(gate) * up, gate/up = linear(n2), n2 = rmsnorm(x2).
  linear_lora_backward(s.dh, false, d_resid, a.h, kDownProj, w, a);
  {
    ScopedSection section("swiglu bwd");
    swiglu_backward(s.dgate, s.dup, s.dh, a.gate, a.up);
  }
  linear_lora_backward(s.d_norm, false, s.dgate, a.n2, kGateProj, w, a);
  linear_lora_backward(s.d_norm, true, s.dup, a.n2, kUpProj, w, a);
  {
    ScopedSection section("rmsnorm + residual bwd");
    rmsnorm_backward(s.d_norm, w.d_post_norm.data ? w.d_post_norm : s.norm_weight_sink.view(), s.d_norm, a.x2,
                     w.post_norm, a.rstd2);
    accumulate(d_resid, s.d_norm);  // d_resid is now the gradient of x2
  }

  // Attention: x2 = x + o(att), att = attention(rope(q), rope(k), v), q/k/v = linear(n1).
  linear_lora_backward(s.d_att, false, d_resid, a.att, kOProj, w, a);
  const Shape q_heads = heads_shape(d, d.H), kv_heads = heads_shape(d, d.KV);
  {
    ScopedSection section("attention bwd");
    attention_backward(s.dq.view().reshaped(q_heads), s.dk.view().reshaped(kv_heads), s.dv.view().reshaped(kv_heads),
                       s.d_att.view().reshaped(q_heads), a.q.view().reshaped(q_heads), a.k.view().reshaped(kv_heads),
                       a.v.view().reshaped(kv_heads), a.att.view().reshaped(q_heads), a.lse);
  }
  {
    ScopedSection section("rope bwd");
    rope_backward(s.dq.view().reshaped(q_heads), rope, 0);
    rope_backward(s.dk.view().reshaped(kv_heads), rope, 0);
  }
  linear_lora_backward(s.d_norm, false, s.dq, a.n1, kQProj, w, a);
  linear_lora_backward(s.d_norm, true, s.dk, a.n1, kKProj, w, a);
  linear_lora_backward(s.d_norm, true, s.dv, a.n1, kVProj, w, a);
  ScopedSection section("rmsnorm + residual bwd");
  rmsnorm_backward(s.d_norm, w.d_input_norm.data ? w.d_input_norm : s.norm_weight_sink.view(), s.d_norm, x,
                   w.input_norm, a.rstd1);
  accumulate(d_resid, s.d_norm);  // the gradient of the layer's input
}

}  // namespace fsdpq
