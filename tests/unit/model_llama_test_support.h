// Helpers of the LlamaModel tests (tests/unit/model_llama_*_test.cpp): the tiny preset with a
// small vocabulary, option sets per train type, random batches, and reading tensors back.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "model/llama_model.h"
#include "model/presets.h"
#include "ops/cross_entropy.h"
#include "optim/optimizer.h"

namespace fsdpq::test {

// The tiny preset (hidden 64, 2 layers, 4 heads, 2 KV heads, intermediate 176) with vocab 300.
inline LlamaConfig tiny_llama(int64_t vocab = 300, double initializer_range = 0.02) {
  LlamaConfig config = preset_or_fail("tiny");
  config.vocab_size = vocab;
  config.initializer_range = initializer_range;
  return config;
}

// tiny_llama widened (hidden 512, intermediate 1408, 8 heads of 64, 4 KV heads, 4 layers): widths at
// which a GPU dequantisation takes long enough for a race with the products beside it to show.
inline LlamaConfig tiny_llama_wide() {
  LlamaConfig config = tiny_llama();
  config.hidden_size = 512;
  config.intermediate_size = 1408;
  config.num_attention_heads = 8;
  config.num_key_value_heads = 4;
  config.head_dim = 64;
  config.num_hidden_layers = 4;
  return config;
}

// Sets lora_fold() (FSDPQ_LORA_FOLD) for a scope.
class LoraFoldSetting {
 public:
  explicit LoraFoldSetting(bool fold) : saved_(lora_fold()) { set_lora_fold(fold); }
  ~LoraFoldSetting() { set_lora_fold(saved_); }
  LoraFoldSetting(const LoraFoldSetting&) = delete;
  LoraFoldSetting& operator=(const LoraFoldSetting&) = delete;

 private:
  bool saved_;
};

inline std::vector<std::string> all_linear_targets() {
  return {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
}

// train_type lora (bf16/fp32 frozen base) or qlora (NF4 base), adapters on every linear.
inline ModelOptions lora_options(Precision precision, bool quantize_base, double dropout = 0.0, int64_t rank = 4) {
  ModelOptions o;
  o.quantize_base = quantize_base;
  o.train_base = false;
  o.lora_rank = rank;
  o.lora_alpha = 8;
  o.lora_dropout = dropout;
  o.lora_targets = all_linear_targets();
  o.precision = precision;
  o.gradient_checkpointing = true;
  o.seed = 42;
  return o;
}

inline ModelOptions full_options(Precision precision) {
  ModelOptions o;
  o.quantize_base = false;
  o.train_base = true;
  o.lora_targets = {};
  o.precision = precision;
  return o;
}

// Uniform token ids; labels equal the ids except the first `masked` positions of each row (-100),
// as a prompt mask would leave them.
inline data::Batch random_batch(int64_t B, int64_t T, int64_t vocab, uint32_t seed, int64_t masked = 2) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  data::Batch batch;
  batch.batch_size = B;
  batch.seq_len = T;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = token(rng);
      batch.input_ids.push_back(id);
      batch.labels.push_back(t < masked ? kIgnoreIndex : id);
    }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 1; t < T; ++t) batch.target_tokens += batch.labels[static_cast<size_t>(b * T + t)] != kIgnoreIndex;
  return batch;
}

// Rows [first, first + count) of a batch, as its own batch.
inline data::Batch batch_rows(const data::Batch& batch, int64_t first, int64_t count) {
  data::Batch out;
  out.batch_size = count;
  out.seq_len = batch.seq_len;
  const auto begin = static_cast<long>(first * batch.seq_len), end = static_cast<long>((first + count) * batch.seq_len);
  out.input_ids.assign(batch.input_ids.begin() + begin, batch.input_ids.begin() + end);
  out.labels.assign(batch.labels.begin() + begin, batch.labels.begin() + end);
  for (int64_t b = 0; b < count; ++b)
    for (int64_t t = 1; t < out.seq_len; ++t)
      out.target_tokens += out.labels[static_cast<size_t>(b * out.seq_len + t)] != kIgnoreIndex;
  return out;
}

inline std::vector<float> floats_of(const Tensor& t) {
  const float* p = t.data<float>();
  return std::vector<float>(p, p + t.numel());
}

inline bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && std::memcmp(a.view().data, b.view().data, a.nbytes()) == 0;
}

// Every adapter's B (and so the adapter) made non-zero: uniform in [-scale, scale).
inline void randomize_lora_b(LlamaModel& model, uint32_t seed, float scale = 0.1f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (const TrainableParameter& p : model.trainable_parameters())
    if (p.name.find("lora_B") != std::string::npos) {
      float* v = p.master->data<float>();
      for (int64_t i = 0; i < p.master->numel(); ++i) v[i] = dist(rng);
    }
  model.masters_updated();
}

// One forward_backward of a fresh random model (seed 9, every adapter's B random): the loss and
// copies of every trainable tensor's gradient.
struct GradSnapshot {
  LossSum loss;
  std::vector<Tensor> grads;
};

inline GradSnapshot run_step(const LlamaConfig& config, ModelOptions options, bool checkpointing, const data::Batch& batch,
                      uint64_t step_key) {
  options.gradient_checkpointing = checkpointing;
  LlamaModel model = LlamaModel::random(config, 9, options);
  randomize_lora_b(model, 10);
  GradSnapshot snap;
  snap.loss = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, step_key);
  for (const TrainableParameter& p : model.trainable_parameters()) {
    Tensor copy = Tensor::empty(p.grad->shape(), DType::F32);
    std::memcpy(copy.view().data, p.grad->view().data, p.grad->nbytes());
    snap.grads.push_back(std::move(copy));
  }
  return snap;
}

inline void expect_bit_identical(const GradSnapshot& a, const GradSnapshot& b) {
  EXPECT_EQ(a.loss.loss_sum, b.loss.loss_sum);
  EXPECT_EQ(a.loss.tokens, b.loss.tokens);
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(same_bits(a.grads[i], b.grads[i])) << "tensor " << i;
}

// ||got - want||_2 / ||want||_2.
inline double normwise_error(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

struct LossBeforeAndAfter {
  double initial = 0, final = 0;  // evaluate()'s mean loss (no dropout)
};

// `steps` AdamW steps (lr 1e-2, betas 0.9/0.95, eps 1e-5, no weight decay) on one fixed batch, the
// step index as the dropout key: the loss before and after. The model training tests memorise
// a tiny batch with it.
inline LossBeforeAndAfter train_on_one_batch(LlamaModel& model, const data::Batch& batch, int steps = 30) {
  std::vector<ShardOptimizer> optimizers;
  const OptimizerConfig adamw = optimizer_config("adamw", 1e-2, 0.0);
  for (const TrainableParameter& p : model.trainable_parameters()) optimizers.emplace_back(adamw, p.master->numel());
  LossBeforeAndAfter loss;
  loss.initial = model.evaluate(batch).mean();
  for (int step = 0; step < steps; ++step) {
    model.zero_grads();
    model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, static_cast<uint64_t>(step));
    const auto params = model.trainable_parameters();
    for (size_t i = 0; i < params.size(); ++i)
      optimizers[i].step(params[i].master->data<float>(), params[i].grad->data<float>(), adamw.lr);
    model.masters_updated();
  }
  loss.final = model.evaluate(batch).mean();
  return loss;
}

}  // namespace fsdpq::test
