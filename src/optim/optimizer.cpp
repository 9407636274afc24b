#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels/adam_scalars.h"
#include "util/bf16.h"
#include "util/error.h"

namespace fsdpq {
namespace {

// The per-element arithmetic follows torch's single-tensor implementations operation by
// operation, in fp32 with the Python-side scalars rounded to fp32 (as torch does when it applies
// a Python float to an fp32 tensor). Comments name the torch call each line mirrors.
//
// Each optimizer steps a range [begin, end) in one branch-free `omp simd` loop (it vectorises:
// -fno-math-errno in CMakeLists.txt lets sqrt vectorise), reading gradient element i through
// `load(i)`. in_blocks spreads blocks of the shard over the OpenMP threads and, per block, runs
// the fused step's epilogue while the block is still in cache. Results do not depend on the
// blocking: every element is computed alone.

// torch.lerp(self, end, weight) for fp32 (ATen/native/Lerp.h): two forms for accuracy.
inline float lerp(float self, float end, float weight) {
  return std::fabs(weight) < 0.5f ? self + weight * (end - self)
                                  : end - (end - self) * (1.0f - weight);
}

template <class Load>
void adam_range(const AdamScalars& scalars, float* param, Load load, float* exp_avg, float* exp_avg_sq, int64_t begin,
                int64_t end) {
  const AdamScalars s = scalars;  // a local copy: the stores below cannot alias it, so the loop vectorises
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float p = param[i];
    float g = load(i);
    if (s.decoupled) p = p * s.decay_factor;  // param.mul_(1 - lr * wd)
    if (s.l2) g = g + s.l2_weight * p;        // grad.add(param, alpha=wd)
    const float m = lerp(exp_avg[i], g, s.avg_weight);   // exp_avg.lerp_(grad, 1 - beta1)
    float v = exp_avg_sq[i] * s.beta2;                   // exp_avg_sq.mul_(beta2)
    v = v + s.sq_weight * g * g;                         //   .addcmul_(grad, grad, 1 - beta2)
    const float denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
    param[i] = p + s.neg_step_size * m / denom;  // param.addcdiv_(exp_avg, denom, -step_size)
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

template <class Load>
void sgd_range(const OptimizerConfig& c, double lr, float* param, Load load, int64_t begin, int64_t end) {
  const bool decay = c.weight_decay != 0.0;
  const float l2 = static_cast<float>(c.weight_decay);
  const float neg_lr = static_cast<float>(-lr);
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float g = load(i);
    if (decay) g = g + l2 * param[i];
    param[i] = param[i] + neg_lr * g;  // param.add_(grad, alpha=-lr)
  }
}

template <class Load>
void adadelta_range(const OptimizerConfig& c, double lr, float* param, Load load, float* square_avg,
                    float* acc_delta, int64_t begin, int64_t end) {
  const bool decay = c.weight_decay != 0.0;
  const float l2 = static_cast<float>(c.weight_decay);
  const float rho = static_cast<float>(c.rho);
  const float one_minus_rho = static_cast<float>(1.0 - c.rho);
  const float eps = static_cast<float>(c.eps);
  const float neg_lr = static_cast<float>(-lr);
#pragma omp simd
  for (int64_t i = begin; i < end; ++i) {
    float g = load(i);
    if (decay) g = g + l2 * param[i];
    float sq = square_avg[i] * rho;  // square_avg.mul_(rho).addcmul_(grad, grad, 1 - rho)
    sq = sq + one_minus_rho * g * g;
    const float std_dev = std::sqrt(sq + eps);        // square_avg.add(eps).sqrt_()
    float delta = std::sqrt(acc_delta[i] + eps);      // acc_delta.add(eps).sqrt_()
    delta = delta / std_dev;                          // delta.div_(std)
    delta = delta * g;                                //   .mul_(grad)
    float acc = acc_delta[i] * rho;                   // acc_delta.mul_(rho)
    acc = acc + one_minus_rho * delta * delta;        //   .addcmul_(delta, delta, 1 - rho)
    param[i] = param[i] + neg_lr * delta;             // param.add_(delta, alpha=-lr)
    square_avg[i] = sq;
    acc_delta[i] = acc;
  }
}

// [0, n) in blocks over the OpenMP threads: `step(begin, end)`, then `after(begin, end)`.
template <class Step, class After>
void in_blocks(int64_t n, Step step, After after) {
  constexpr int64_t kBlock = int64_t{1} << 14;  // 64 KiB of each fp32 buffer: stays in L2 for the epilogue
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
    step(begin, end);
    after(begin, end);
  }
}

template <class Load, class After>
void step_with(const OptimizerConfig& config, double lr, int64_t step, float* param, Load load, After after,
               float* const* state, int64_t n) {
  if (step < 1) throw std::logic_error("optimizer_step: step counts from 1");
  switch (config.kind) {
    case OptimizerKind::adamw:
    case OptimizerKind::adam: {
      const AdamScalars s = adam_scalars(config.beta1, config.beta2, config.eps, config.weight_decay,
                                         config.kind == OptimizerKind::adamw, lr, step);
      in_blocks(n, [&](int64_t b, int64_t e) { adam_range(s, param, load, state[0], state[1], b, e); }, after);
      return;
    }
    case OptimizerKind::sgd:
      in_blocks(n, [&](int64_t b, int64_t e) { sgd_range(config, lr, param, load, b, e); }, after);
      return;
    case OptimizerKind::adadelta:
      in_blocks(n, [&](int64_t b, int64_t e) { adadelta_range(config, lr, param, load, state[0], state[1], b, e); },
                after);
      return;
  }
  throw std::logic_error("unknown OptimizerKind");
}

// dst[i] = src[i] in `dtype` over [begin, end) (bf16 / f16: round to nearest even).
void store_range(DType dtype, const float* src, void* dst, int64_t begin, int64_t end) {
  if (dtype == DType::F32) {
    std::memcpy(static_cast<float*>(dst) + begin, src + begin, static_cast<size_t>(end - begin) * sizeof(float));
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  if (dtype == DType::BF16) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) out[i] = float_to_bf16(src[i]);
  } else {
    for (int64_t i = begin; i < end; ++i) out[i] = float_to_f16(src[i]);
  }
}

}  // namespace

OptimizerKind parse_optimizer(std::string_view name) {
  if (name == "adamw" || name == "fused_adamw") return OptimizerKind::adamw;
  if (name == "adam" || name == "fused_adam") return OptimizerKind::adam;
  if (name == "sgd") return OptimizerKind::sgd;
  if (name == "adadelta") return OptimizerKind::adadelta;
  fail("optimizer: unknown value '{}' (allowed: adamw, fused_adamw, adam, fused_adam, sgd, adadelta)", name);
}

OptimizerConfig optimizer_config(OptimizerKind kind, double lr, double weight_decay) {
  OptimizerConfig c;
  c.kind = kind;
  c.lr = lr;
  switch (kind) {
    case OptimizerKind::adamw:
      c.beta1 = 0.9;
      c.beta2 = 0.95;
      c.eps = 1e-5;
      c.weight_decay = weight_decay;
      break;
    case OptimizerKind::adam:  // torch.optim.Adam defaults
      c.beta1 = 0.9;
      c.beta2 = 0.999;
      c.eps = 1e-8;
      c.weight_decay = 0.0;
      break;
    case OptimizerKind::sgd:  // no momentum, no weight decay
      c.weight_decay = 0.0;
      break;
    case OptimizerKind::adadelta:  // torch.optim.Adadelta defaults
      c.rho = 0.9;
      c.eps = 1e-6;
      c.weight_decay = 0.0;
      break;
  }
  return c;
}

OptimizerConfig optimizer_config(std::string_view name, double lr, double weight_decay) {
  return optimizer_config(parse_optimizer(name), lr, weight_decay);
}

std::string_view optimizer_kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adamw: return "adamw";
    case OptimizerKind::adam: return "adam";
    case OptimizerKind::sgd: return "sgd";
    case OptimizerKind::adadelta: return "adadelta";
  }
  throw std::logic_error("unknown OptimizerKind");
}

std::vector<std::string> optimizer_state_names(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::adamw:
    case OptimizerKind::adam: return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::sgd: return {};
    case OptimizerKind::adadelta: return {"square_avg", "acc_delta"};
  }
  throw std::logic_error("unknown OptimizerKind");
}

void optimizer_step(const OptimizerConfig& config, double lr, int64_t step, float* param,
                    const float* grad, float* const* state, int64_t n) {
  step_with(config, lr, step, param, [grad](int64_t i) { return grad[i]; }, [](int64_t, int64_t) {}, state, n);
}

void optimizer_step(const OptimizerConfig& config, double lr, int64_t step, float* param, float* grad,
                    float* const* state, int64_t n, const StepFusion& fusion) {
  const int64_t compute_numel = fusion.compute_numel;
  if (compute_numel < 0 || compute_numel > n || (compute_numel > 0 && !fusion.compute))
    throw std::logic_error("optimizer_step: the fused compute copy must cover a prefix of the shard");
  const DType dtype = fusion.compute_dtype;
  if (compute_numel > 0 && dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    throw std::logic_error("optimizer_step: the fused compute copy must be F32, BF16 or F16");
  const float scale = fusion.grad_scale;
  const bool zero = fusion.zero_grad;
  void* compute = fusion.compute;
  step_with(
      config, lr, step, param, [grad, scale](int64_t i) { return grad[i] * scale; },
      [=](int64_t begin, int64_t end) {
        if (zero) std::fill(grad + begin, grad + end, 0.0f);
        if (begin < compute_numel) store_range(dtype, param, compute, begin, std::min(end, compute_numel));
      },
      state, n);
}

ShardOptimizer::ShardOptimizer(OptimizerConfig config, int64_t numel)
    : config_(config), numel_(numel), names_(optimizer_state_names(config.kind)) {
  if (numel < 0) throw std::logic_error("ShardOptimizer: negative numel");
  buffers_.assign(names_.size(), std::vector<float>(static_cast<size_t>(numel), 0.0f));
}

void ShardOptimizer::step(float* param, const float* grad, double lr) {
  ++step_count_;
  std::vector<float*> state;
  for (auto& buffer : buffers_) state.push_back(buffer.data());
  optimizer_step(config_, lr, step_count_, param, grad, state.data(), numel_);
}

void ShardOptimizer::step(float* param, float* grad, double lr, const StepFusion& fusion) {
  ++step_count_;
  std::vector<float*> state;
  for (auto& buffer : buffers_) state.push_back(buffer.data());
  optimizer_step(config_, lr, step_count_, param, grad, state.data(), numel_, fusion);
}

std::vector<ShardOptimizer::NamedBuffer> ShardOptimizer::state_buffers() {
  std::vector<NamedBuffer> out;
  for (size_t k = 0; k < names_.size(); ++k) out.push_back({names_[k], std::span<float>(buffers_[k])});
  return out;
}

nlohmann::json optimizer_state_json(OptimizerKind kind, int64_t step, int64_t numel) {
  return {{"optimizer", std::string(optimizer_kind_name(kind))}, {"step", step}, {"numel", numel}};
}

int64_t optimizer_step_from_json(OptimizerKind kind, int64_t numel, const nlohmann::json& state) {
  const std::string name = state.at("optimizer").get<std::string>();
  if (name != optimizer_kind_name(kind))
    fail("checkpoint optimizer state is for '{}', but this run uses '{}'", name, optimizer_kind_name(kind));
  const int64_t saved_numel = state.at("numel").get<int64_t>();
  if (saved_numel != numel)
    fail("checkpoint optimizer state has {} elements for this shard, expected {}", saved_numel, numel);
  const int64_t step = state.at("step").get<int64_t>();
  if (step < 0) fail("checkpoint optimizer state has a negative step count ({})", step);
  return step;
}

nlohmann::json ShardOptimizer::state_json() const { return optimizer_state_json(config_.kind, step_count_, numel_); }

void ShardOptimizer::load_state_json(const nlohmann::json& state) {
  step_count_ = optimizer_step_from_json(config_.kind, numel_, state);
}

}  // namespace fsdpq
