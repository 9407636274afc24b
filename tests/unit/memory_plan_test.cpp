// The memory planner (plan/memory_plan.h): hand-computed sizes, sharding and optimizer state,
// the guide's order and recommendation, the activation bytes against what a real CPU training
// pass allocates (exact), and the 7B GPU measurements of bench/RESULTS.md (within 10%).
#include "plan/memory_plan.h"

#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "backend/caching_allocator.h"
#include "backend/host_tensor_bytes.h"
#include "kernels/lora_fused_shape.h"
#include "model/llama_layer.h"
#include "model/presets.h"
#include "ops/lora.h"
#include "model_llama_test_support.h"
#include "test_support.h"

namespace fsdpq {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

PlanInput tiny_input(int64_t B, int64_t T, bool on_gpu) {
  PlanInput p;
  p.model = test::tiny_llama(300);
  p.quantized = true;
  p.lora_rank = 4;
  p.lora_targets = {"q_proj", "v_proj"};
  p.lora_dropout = 0;
  p.activation = DType::BF16;
  p.context_length = T;
  p.on_gpu = on_gpu;
  p.setting.batch_size = B;
  return p;
}

// hqq_lora's frozen linears are counted from HQQ's segments: per 64 weights n_bits · 8 bytes of
// codes and 4 bytes of zero point and scale (3 bits: ten groups' codes per int32 word).
TEST(MemoryPlan, HqqFrozenWeightsAreItsSegments) {
  PlanInput p = tiny_input(1, 8, false);
  const auto frozen = [&](int bits) {
    p.hqq_bits = bits;
    for (const MemoryItem& i : predict_memory(p).items)
      if (i.what == (bits ? "frozen HQQ weights" : "frozen NF4 weights")) return i.host;
    return int64_t{-1};
  };
  // tiny: 2 layers of q, k, v, o (64·64, 32·64, 32·64, 64·64) and gate, up, down (176·64 each):
  // 45,056 weights a layer, 704 groups.
  const int64_t weights = 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 176 * 64), groups = weights / 64;
  EXPECT_EQ(frozen(4), weights / 2 + 4 * groups);
  EXPECT_EQ(frozen(2), weights / 4 + 4 * groups);
  EXPECT_EQ(frozen(8), weights + 4 * groups);
  EXPECT_LT(frozen(0), frozen(4)) << "NF4 with double quantisation: 4.13 bits; HQQ 4 bits: 4.5";
}

TEST(MemoryPlan, LayerActivationsByHand) {
  // tiny: C 64, H 4, KV 2, D 16, I 176; B 2, T 8 → N 16; bf16; LoRA r 4 on q and v.
  // n1, q, att, x2, n2: 16·64·2 = 2048 each; k, v: 16·32·2 = 1024 each; rstd1/2: 64 each;
  // lse: 2·4·8·4 = 256; gate, up, h: 16·176·2 = 5632 each; xa: q and v share one input, so one
  // [16, 4 + 4] for the pair, 16·8·2 = 256.
  const int64_t host = 5 * 2048 + 2 * 1024 + 2 * 64 + 256 + 3 * 5632 + 256;
  EXPECT_EQ(activation_bytes(tiny_input(2, 8, false)).layer, host);
  // On the GPU each allocation is rounded up to a multiple of 512 bytes: 64/128/256 → 512
  // (2048, 1024 and 5632 = 11 · 512 already are).
  const int64_t gpu = 5 * 2048 + 2 * 1024 + 2 * 512 + 512 + 3 * 5632 + 512;
  EXPECT_EQ(activation_bytes(tiny_input(2, 8, true)).layer, gpu);

  // The same as LayerActivations itself allocates.
  LayerActivations a;
  a.allocate(layer_dims(test::tiny_llama(300), 2, 8), DType::BF16, {4, 0, 4, 0, 0, 0, 0}, false);
  EXPECT_EQ(a.nbytes(), host);
}

// recompute_elementwise: a layer keeps neither n1, n2 nor h (3 · 2048 + ... on the host: n1, n2 2048
// each, h 5632), and the pass holds one shared [N, C] and one [N, I] buffer instead; LayerActivations
// allocates exactly that.
TEST(MemoryPlan, ElementwiseRecomputeTrimsEachKeptLayer) {
  PlanInput p = tiny_input(2, 8, false);
  const ActivationBytes whole = activation_bytes(p);
  p.setting.recompute_elementwise = true;
  const ActivationBytes trimmed = activation_bytes(p);
  EXPECT_EQ(whole.layer - trimmed.layer, 2 * 2048 + 5632);
  EXPECT_EQ(trimmed.shared_elementwise, 2048 + 5632);
  EXPECT_EQ(whole.shared_elementwise, 0);
  ElementwiseScratch shared;
  const LayerDims d = layer_dims(test::tiny_llama(300), 2, 8);
  shared.allocate(d, DType::BF16);
  LayerActivations a;
  a.allocate(d, DType::BF16, {4, 0, 4, 0, 0, 0, 0}, false, Device::CPU, &shared);
  EXPECT_EQ(a.nbytes(), trimmed.layer);
  EXPECT_EQ(static_cast<int64_t>(shared.norm.nbytes() + shared.h.nbytes()), trimmed.shared_elementwise);
  // Without checkpointing every layer is kept: the saving is the layer count times the trim, less
  // the shared set.
  EXPECT_EQ(whole.peak - trimmed.peak,
            whole.kept_layers * (whole.layer - trimmed.layer) - trimmed.shared_elementwise);
}

TEST(MemoryPlan, CheckpointingKeepsOneLayer) {
  PlanInput p = tiny_input(4, 64, false);
  p.setting.gradient_checkpointing = false;
  const ActivationBytes full = activation_bytes(p);
  p.setting.gradient_checkpointing = true;
  const ActivationBytes ckpt = activation_bytes(p);
  EXPECT_EQ(full.kept_layers, p.model.num_hidden_layers);
  EXPECT_EQ(ckpt.kept_layers, 1);
  EXPECT_EQ(full.layer, ckpt.layer);
  // Backward peaks: L layers kept vs one layer plus every other recomputed layer's xa
  // (LayerActivations::xa_kept); the recompute stops at h, so it needs no output buffer.
  const int64_t one_input = 4 * 64 * p.model.hidden_size * 2;
  EXPECT_GT(ckpt.checkpointed_xa, 0);
  EXPECT_EQ(full.checkpointed_xa, 0);
  EXPECT_EQ(full.backward_peak - ckpt.backward_peak, (p.model.num_hidden_layers - 1) * full.layer - ckpt.checkpointed_xa);
  // Residual stream: L + 1 inputs and the ids, either way.
  EXPECT_EQ(ckpt.stream, (p.model.num_hidden_layers + 1) * one_input + 4 * 64 * 4);
}

TEST(MemoryPlan, ShardGroupSizes) {
  EXPECT_EQ(shard_group_size(ShardingStrategy::Ddp, 8, 0), 1);
  EXPECT_EQ(shard_group_size(ShardingStrategy::FullShard, 8, 0), 8);
  EXPECT_EQ(shard_group_size(ShardingStrategy::ShardGradOp, 8, 4), 8);
  EXPECT_EQ(shard_group_size(ShardingStrategy::HybridFullShard, 8, 4), 4);
  EXPECT_EQ(shard_group_size(ShardingStrategy::HybridShardGradOp, 8, 0), 8);
}

PlanInput llama2_7b(bool quantized) {
  PlanInput p;
  p.model = preset_or_fail("llama2-7b");
  p.quantized = quantized;
  p.lora_rank = 64;
  p.lora_targets = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"};
  p.lora_dropout = 0.1;
  p.context_length = 512;
  p.setting = {ShardingStrategy::FullShard, true, false, false, 4};
  return p;
}

TEST(MemoryPlan, OptimizerStateAndOffload) {
  // 7B LoRA r 64 on six modules: 4,472,832 adapter weights per layer × 32 layers.
  const int64_t lora = 4'472'832LL * 32;
  PlanInput p = llama2_7b(true);
  p.on_gpu = false;  // host bytes are not rounded: exact differences
  const int64_t adamw = predict_memory(p).host_per_rank;
  p.optimizer = OptimizerKind::sgd;
  const int64_t sgd = predict_memory(p).host_per_rank;
  EXPECT_EQ(adamw - sgd, 2 * 4 * lora);  // exp_avg + exp_avg_sq, fp32

  // CPU offload on one GPU moves the fp32 master, gradient and 2 state buffers of every shard off
  // the GPU, and the layers' frozen weights too: after loading none is there, and in a pass two
  // layers' are (fsdp/frozen_offload.h). The root's (embedding, head, final norm) stay.
  p = llama2_7b(true);
  const MemoryPrediction on_gpu = predict_memory(p);
  p.setting.cpu_offload = true;
  const MemoryPrediction offloaded = predict_memory(p);
  auto gpu_item = [](const MemoryPrediction& m, const std::string& prefix) {
    for (const MemoryItem& item : m.items)
      if (item.what.rfind(prefix, 0) == 0) return item.gpu;
    ADD_FAILURE() << "no item " << prefix;
    return int64_t{0};
  };
  const int64_t layers_nf4 = gpu_item(on_gpu, "frozen NF4 weights");
  const int64_t layers_dense = gpu_item(on_gpu, "frozen dense weights") - gpu_item(offloaded, "frozen dense weights");
  // Per layer unit 4,472,832 fp32 = 17.06 MiB per buffer, rounded by the allocator to 18 MiB.
  EXPECT_EQ(on_gpu.gpu_after_load - offloaded.gpu_after_load, 4 * 32 * (int64_t{18} << 20) + layers_nf4 + layers_dense);
  EXPECT_EQ(gpu_item(offloaded, "frozen layer weights: 2 layers"), (layers_nf4 + layers_dense) / 16);
  EXPECT_GT(layers_dense, 0);  // the layers' RMSNorm weights
  EXPECT_GT(offloaded.host_per_rank, on_gpu.host_per_rank + 11 * lora);  // grad + 2 states (+ master copy)
}

TEST(MemoryPlan, FullShardDividesState) {
  PlanInput p = llama2_7b(true);
  p.world_size = 4;
  const MemoryPrediction four = predict_memory(p);
  EXPECT_EQ(four.shard_size, 4);
  p.world_size = 1;
  const MemoryPrediction one = predict_memory(p);
  // Resident: every weight and all state; sharded: a quarter of the state (weights are gathered).
  // A quarter of a layer's 4,472,832 adapter weights in fp32 is 4.27 MiB, allocated as 6 MiB (2 MiB
  // granules), four buffers (master, grad, exp_avg, exp_avg_sq) per layer; the root trains nothing.
  // Beside it, as FSDP keeps them, the rank's quarter of the weights: the frozen NF4 and dense
  // bytes and the adapters' compute copies.
  const auto item = [](const MemoryPrediction& m, const std::string& prefix) {
    for (const MemoryItem& i : m.items)
      if (i.what.rfind(prefix, 0) == 0) return i.gpu;
    ADD_FAILURE() << "no item " << prefix;
    return int64_t{0};
  };
  const int64_t shards = item(four, "this rank's shards of the weights");
  EXPECT_EQ(four.gpu_after_load, 32 * 4 * (int64_t{6} << 20) + shards);
  const double whole = static_cast<double>(item(one, "frozen NF4 weights") + item(one, "frozen dense weights") +
                                           item(one, "trainable compute copies"));
  EXPECT_NEAR(static_cast<double>(shards), whole / 4, 0.02 * whole / 4);
  EXPECT_GT(one.gpu_after_load, four.gpu_after_load + 2.5 * kGiB);  // the NF4 model stays on one GPU
  // ddp on 4 GPUs keeps everything on each, like one GPU.
  p.world_size = 4;
  p.setting.strategy = ShardingStrategy::Ddp;
  EXPECT_EQ(predict_memory(p).gpu_after_load, one.gpu_after_load);
  // shard_grad_op keeps every layer gathered until its backward: more than full_shard's 2 in flight.
  p.setting.strategy = ShardingStrategy::ShardGradOp;
  EXPECT_GT(predict_memory(p).gpu_peak, four.gpu_peak + 2.5 * kGiB);
}

// bench/RESULTS.md, 2026-12-03, one H200, fsdpq itself: llama2-7b, LoRA r64 α16 dropout 0.1 on
// q,k,v,gate,up,down, bs 4, ctx 512, checkpointing, bf16, adamw.
// The runs behind these numbers wrote a dropped copy of x per adapter (the separate LoRA kernels,
// ops/lora.h): the plan is compared as of those kernels.
class SeparateLoraKernels {
 public:
  SeparateLoraKernels() : saved_(gpu_lora_kernels()) { set_gpu_lora_kernels(GpuLoraKernels::Separate); }
  ~SeparateLoraKernels() { set_gpu_lora_kernels(saved_); }

 private:
  GpuLoraKernels saved_;
};

TEST(MemoryPlan, MatchesTheMeasured7BRunsWithin10Percent) {
  const SeparateLoraKernels measured_with;
  const MemoryPrediction qlora = predict_memory(llama2_7b(true));
  EXPECT_NEAR(qlora.gpu_after_load / kGiB, 6.23, 0.623);
  EXPECT_NEAR(qlora.gpu_peak / kGiB, 7.94, 0.794);
  const MemoryPrediction lora = predict_memory(llama2_7b(false));
  EXPECT_NEAR(lora.gpu_peak / kGiB, 16.5, 1.65);
  // use_cpu_offload on one GPU (frozen layers streamed from host memory): peak 2.36 GiB allocated on
  // an H100, 2026-12-06 (bench/RESULTS.md, stop 44: bench.py --peers fsdpq_qlora --ctx 512 --bs 4
  // --grad-ckpt on --fsdpq-args "--use_cpu_offload true"; 2.72 on 2026-12-03, when each activation
  // gradient of a layer's backward had a buffer of its own).
  PlanInput offload = llama2_7b(true);
  offload.setting.cpu_offload = true;
  EXPECT_NEAR(predict_memory(offload).gpu_peak / kGiB, 2.36, 0.236);
  // preset:llama2-70b QLoRA r64, bs 1, ctx 2048, one H200 (2026-12-03): 46.74 GiB after load,
  // 52.62 GiB peak.
  PlanInput big = llama2_7b(true);
  big.model = preset_or_fail("llama2-70b");
  big.context_length = 2048;
  big.setting.batch_size = 1;
  const MemoryPrediction b = predict_memory(big);
  EXPECT_NEAR(b.gpu_after_load / kGiB, 46.74, 4.674);
  EXPECT_NEAR(b.gpu_peak / kGiB, 52.62, 5.262);
}

// The fused LoRA kernels (GPU, 16-bit, dropout) write no dropped copy of x: the plan counts their
// fp32 partial sums instead (kernels/lora_fused_shape.h), which are smaller; groups they do not
// take (rank 8 is not a multiple of 16) keep the copies.
TEST(MemoryPlan, FusedLoraKernelsPlanTheirScratchInsteadOfDroppedCopies) {
  const GpuLoraKernels saved = gpu_lora_kernels();
  PlanInput p = llama2_7b(true);
  p.context_length = 2048;
  auto temporary = [&](GpuLoraKernels kernels) {
    set_gpu_lora_kernels(kernels);
    return activation_bytes(p).op_temporary;
  };
  const int64_t fused = temporary(GpuLoraKernels::Fused), separate = temporary(GpuLoraKernels::Separate);
  EXPECT_LT(fused, separate);
  // At least the down group's dA partial sums (8192 rows: 8 chunks x 64 x 11008 floats).
  const int64_t N = p.setting.batch_size * p.context_length;
  EXPECT_GE(fused, lora_fused::weight_grad_workspace_floats(N, 11008, 64) * 4);
  p.lora_rank = 8;
  EXPECT_EQ(temporary(GpuLoraKernels::Fused), temporary(GpuLoraKernels::Separate));
  p.lora_rank = 64;
  p.lora_dropout = 0.0;  // no masks: one stacked product either way
  EXPECT_EQ(temporary(GpuLoraKernels::Fused), temporary(GpuLoraKernels::Separate));
  set_gpu_lora_kernels(saved);
}

// The guide tries the kept layers trimmed before it checkpoints: on a GPU between what 7B QLoRA at
// ctx 2048 needs at batch 1 without checkpointing and what it needs trimmed, the recommendation is
// to trim, not to checkpoint.
TEST(MemoryPlan, GuideTrimsBeforeItCheckpoints) {
  PlanInput p = llama2_7b(true);
  p.context_length = 2048;
  p.setting = {ShardingStrategy::Ddp, false, false, false, 1};
  const int64_t whole = predict_memory(p).gpu_required;
  p.setting.recompute_elementwise = true;
  const int64_t trimmed = predict_memory(p).gpu_required;
  ASSERT_LT(trimmed, whole);
  const GuideResult guide = walk_guide(p, (whole + trimmed) / 2, 0, 64);
  ASSERT_EQ(guide.recommended, 1);
  const GuideStep& g = guide.steps[1];
  EXPECT_EQ(g.name, std::string("+ selective recompute"));
  EXPECT_FALSE(g.setting.gradient_checkpointing);
  EXPECT_TRUE(g.setting.recompute_elementwise);
  EXPECT_EQ(g.setting.batch_size, 1);
}

// checkpoint_every = k recomputes layers 0, k, 2k ... (ceil(L / k) of them, sharing one buffer)
// and keeps the others' activations.
TEST(MemoryPlan, CheckpointingEveryKthLayerKeepsTheOthers) {
  PlanInput p = tiny_input(4, 64, false);
  p.model.num_hidden_layers = 7;
  p.setting.gradient_checkpointing = true;
  for (const auto& [every, kept] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 4}, {3, 5}, {7, 7}, {100, 7}}) {
    p.setting.checkpoint_every = every;
    EXPECT_EQ(activation_bytes(p).kept_layers, kept) << "checkpoint_every " << every;
  }
}

// keep_activation_layers = n: the last n layers are not recomputed (with checkpoint_every, among the
// ones it would recompute); kept layers counts the recomputed ones' shared buffer too.
TEST(MemoryPlan, KeptActivationLayersAreNotRecomputed) {
  PlanInput p = tiny_input(4, 64, false);
  p.model.num_hidden_layers = 7;
  p.setting.gradient_checkpointing = true;
  struct Case {
    int64_t every, keep, kept;
  };
  for (const Case& c : {Case{1, 0, 1}, Case{1, 2, 3}, Case{1, 6, 7}, Case{1, 7, 7}, Case{1, 100, 7}, Case{2, 1, 5},
                        Case{2, 2, 5}, Case{3, 2, 6}}) {
    p.setting.checkpoint_every = c.every;
    p.setting.keep_activation_layers = c.keep;
    EXPECT_EQ(activation_bytes(p).kept_layers, c.kept) << "checkpoint_every " << c.every << ", keep " << c.keep;
  }
}

// Where even checkpoint_every 2 does not fit, the guide keeps as many of the last layers'
// activations as still fit (one more would not), on the 7B at ctx 2048, bs 8 in 24 GiB.
TEST(MemoryPlan, GuideKeepsTheLastLayersActivationsInTheMemoryLeft) {
  PlanInput p = llama2_7b(true);
  p.context_length = 2048;
  const int64_t gpu = static_cast<int64_t>(24 * kGiB);
  const GuideResult guide = walk_guide(p, gpu, 0, 8);
  const GuideStep& ckpt = guide.steps[2];
  ASSERT_EQ(ckpt.name, std::string("+ gradient checkpointing"));
  ASSERT_TRUE(ckpt.fits);
  EXPECT_EQ(ckpt.setting.batch_size, 8);
  EXPECT_EQ(ckpt.setting.checkpoint_every, 1);
  ASSERT_GT(ckpt.setting.keep_activation_layers, 0);
  PlanInput at = p;
  at.setting = ckpt.setting;
  at.setting.keep_dequantized_layers = 0;  // what the dense layers were given came after
  EXPECT_LE(predict_memory(at).gpu_required, gpu);
  ++at.setting.keep_activation_layers;
  EXPECT_GT(predict_memory(at).gpu_required, gpu);
  // Trimmed (recompute_elementwise), the kept layers are ~30% smaller here: more of them fit, by
  // more than one in 10, so the guide trims. Whole, fewer would.
  EXPECT_TRUE(ckpt.setting.recompute_elementwise);
  at.setting = ckpt.setting;
  at.setting.keep_dequantized_layers = 0;
  at.setting.recompute_elementwise = false;
  int64_t whole = 0;
  for (at.setting.keep_activation_layers = 1; predict_memory(at).gpu_required <= gpu; ++at.setting.keep_activation_layers)
    whole = at.setting.keep_activation_layers;
  EXPECT_GT((ckpt.setting.keep_activation_layers - whole) * 10, ckpt.setting.keep_activation_layers);
}

// At a checkpointing step's batch the guide recomputes as few layers as still fit: the next
// larger checkpoint_every would not.
TEST(MemoryPlan, GuideRecomputesTheFewestLayersThatFit) {
  const PlanInput p = llama2_7b(true);
  for (double gib : {24.0, 40.0, 80.0}) {
    SCOPED_TRACE(gib);
    const int64_t gpu = static_cast<int64_t>(gib * kGiB);
    const GuideResult guide = walk_guide(p, gpu, 0, 64);
    const GuideStep& ckpt = guide.steps[2];
    ASSERT_EQ(ckpt.name, std::string("+ gradient checkpointing"));
    ASSERT_TRUE(ckpt.fits);
    PlanInput at = p;
    at.setting = ckpt.setting;
    EXPECT_LE(predict_memory(at).gpu_required, gpu);
    if (2 * ckpt.setting.checkpoint_every <= p.model.num_hidden_layers) {
      at.setting.checkpoint_every *= 2;  // even with its kept layers trimmed
      at.setting.recompute_elementwise = true;
      at.setting.keep_activation_layers = 0;  // (what the memory left kept where no halving fit)
      EXPECT_GT(predict_memory(at).gpu_required, gpu);
    }
    if (ckpt.setting.recompute_elementwise) {  // and untrimmed at the chosen k it would not fit either
      at.setting = ckpt.setting;
      at.setting.recompute_elementwise = false;
      EXPECT_GT(predict_memory(at).gpu_required, gpu);
    }
  }
}

// keep_dequantized_layers: each fitting step of a quantised base keeps as many of the last layers
// dense as still fit (one more would not, or all are); a dense base keeps none. Every kept layer
// costs one layer's dequantised weights.
TEST(MemoryPlan, GuideKeepsAsManyDenseLayersAsFit) {
  const PlanInput p = llama2_7b(true);
  PlanInput kept = p;
  kept.setting.gradient_checkpointing = false;
  const int64_t per_layer = activation_bytes(kept).dequantized;
  kept.setting.keep_dequantized_layers = 5;  // the shared set and 5 of their own
  EXPECT_EQ(activation_bytes(kept).dequantized, 6 * per_layer);
  kept.setting.keep_dequantized_layers = 100;  // every layer its own, no shared set
  EXPECT_EQ(activation_bytes(kept).dequantized, p.model.num_hidden_layers * per_layer);
  bool some_kept = false;
  for (double gib : {24.0, 40.0, 80.0}) {
    SCOPED_TRACE(gib);
    const int64_t gpu = static_cast<int64_t>(gib * kGiB);
    for (const GuideStep& g : walk_guide(p, gpu, 0, 64).steps) {
      if (!g.fits) continue;
      SCOPED_TRACE(g.name);
      PlanInput at = p;
      at.setting = g.setting;
      EXPECT_LE(predict_memory(at).gpu_required, gpu);
      some_kept |= g.setting.keep_dequantized_layers > 0;
      if (g.setting.keep_dequantized_layers < p.model.num_hidden_layers) {
        ++at.setting.keep_dequantized_layers;
        EXPECT_GT(predict_memory(at).gpu_required, gpu);
      }
    }
  }
  EXPECT_TRUE(some_kept) << "no step kept a layer: the test checks nothing";
  PlanInput dense = p;
  dense.quantized = false;
  for (const GuideStep& g : walk_guide(dense, static_cast<int64_t>(80 * kGiB), 0, 64).steps)
    EXPECT_EQ(g.setting.keep_dequantized_layers, 0) << g.name;
}

// most_kept_dense_layers: the most that fit (one more does not, or all do); 0 for a dense base or
// where not even one fits.
TEST(MemoryPlan, MostKeptDenseLayersThatFit) {
  PlanInput p = llama2_7b(true);
  p.setting.gradient_checkpointing = false;
  p.setting.batch_size = 4;
  const int64_t none = predict_memory(p).gpu_required;
  for (double spare_gib : {0.2, 1.0, 5.0, 100.0}) {
    SCOPED_TRACE(spare_gib);
    const int64_t gpu = none + static_cast<int64_t>(spare_gib * kGiB);
    const int64_t kept = most_kept_dense_layers(p, gpu);
    PlanInput at = p;
    at.setting.keep_dequantized_layers = kept;
    EXPECT_LE(predict_memory(at).gpu_required, gpu);
    if (kept < p.model.num_hidden_layers) {
      at.setting.keep_dequantized_layers = kept + 1;
      EXPECT_GT(predict_memory(at).gpu_required, gpu);
    }
  }
  EXPECT_EQ(most_kept_dense_layers(p, none + static_cast<int64_t>(100 * kGiB)), p.model.num_hidden_layers);
  EXPECT_EQ(most_kept_dense_layers(p, none - 1), 0);
  PlanInput dense = p;
  dense.quantized = false;
  EXPECT_EQ(most_kept_dense_layers(dense, none + static_cast<int64_t>(100 * kGiB)), 0);
}

TEST(MemoryPlan, GuideOrderAndRecommendation) {
  PlanInput p = llama2_7b(true);
  const GuideResult one = walk_guide(p, static_cast<int64_t>(80 * kGiB), 0, 64);
  ASSERT_EQ(one.steps.size(), 7u);
  const std::vector<std::string> names = {"DDP", "+ selective recompute", "+ gradient checkpointing", "shard_grad_op",
                                          "full_shard", "+ CPU offload", "+ activation offload"};
  for (size_t i = 0; i < names.size(); ++i) EXPECT_EQ(one.steps[i].name, names[i]);
  EXPECT_EQ(one.steps[0].setting.strategy, ShardingStrategy::Ddp);
  EXPECT_FALSE(one.steps[0].setting.gradient_checkpointing);
  EXPECT_TRUE(one.steps[1].setting.recompute_elementwise && !one.steps[1].setting.gradient_checkpointing);
  EXPECT_TRUE(one.steps[6].setting.activation_offload && one.steps[6].setting.cpu_offload);
  // 7B QLoRA fits one 80 GiB GPU with plain DDP; the batch is the largest power of two that fits.
  EXPECT_EQ(one.recommended, 0);
  const GuideStep& ddp = one.steps[0];
  EXPECT_LE(ddp.prediction.gpu_required, static_cast<int64_t>(80 * kGiB));
  p.setting = ddp.setting;
  if (ddp.setting.batch_size < 64) {
    p.setting.batch_size *= 2;
    EXPECT_GT(predict_memory(p).gpu_required, static_cast<int64_t>(80 * kGiB));
  }
  // Trimming the kept layers lets at least as large a batch fit, checkpointing a larger one.
  EXPECT_GE(one.steps[1].setting.batch_size, ddp.setting.batch_size);
  EXPECT_GT(one.steps[2].setting.batch_size, ddp.setting.batch_size);

  // 70B QLoRA on 2 × 24 GiB (fsdp_qlora's headline, which it runs with use_cpu_offload): half
  // the NF4 model (~17 GiB) on each GPU leaves too little for the rest, so only sharding with
  // the shards, state and updates on the host fits.
  PlanInput big = llama2_7b(true);
  big.model = preset_or_fail("llama2-70b");
  big.context_length = 2048;
  big.world_size = 2;
  const GuideResult two = walk_guide(big, static_cast<int64_t>(24 * kGiB), 0, 64);
  EXPECT_FALSE(two.steps[0].fits);
  EXPECT_FALSE(two.steps[1].fits);
  EXPECT_FALSE(two.steps[2].fits);
  EXPECT_FALSE(two.steps[3].fits);
  EXPECT_FALSE(two.steps[4].fits);
  EXPECT_TRUE(two.steps[5].setting.cpu_offload);
  EXPECT_EQ(two.recommended, 5);
  // A host limit below what offload needs rules the offload steps out.
  const GuideResult tight = walk_guide(big, static_cast<int64_t>(10 * kGiB), static_cast<int64_t>(4 * kGiB), 64);
  EXPECT_EQ(tight.recommended, -1);
  for (const GuideStep& g : tight.steps) EXPECT_FALSE(g.fits);
}

// Llama-Pro on 7B (LLaMA-Pro-8B's 8 new blocks over 32 layers): the 32 original layers stay NF4
// as under qlora; each new block adds its 202,383,360 weights (4 attention and 3 MLP linears,
// 2 norms) as bf16 compute copies and, resident on one GPU, as four fp32 buffers (master,
// gradient, exp_avg, exp_avg_sq); its gradients are the largest a backward allocates.
TEST(MemoryPlan, LlamaProCountsTheNewBlocksAsDenseTrainableLayers) {
  PlanInput qlora = llama2_7b(true);
  qlora.lora_targets = {};  // the same base, nothing trained
  PlanInput pro = qlora;
  pro.model.num_hidden_layers = 40;
  pro.new_blocks = 8;
  const MemoryPrediction a = predict_memory(qlora), b = predict_memory(pro);
  const auto item = [](const MemoryPrediction& m, const std::string& prefix) {
    for (const MemoryItem& i : m.items)
      if (i.what.rfind(prefix, 0) == 0) return i.gpu;
    return int64_t{0};
  };
  const int64_t block = 4 * 4096LL * 4096 + 3 * 4096LL * 11008 + 2 * 4096;
  EXPECT_EQ(block, 202'383'360);
  EXPECT_EQ(item(b, "frozen NF4 weights"), item(a, "frozen NF4 weights"));
  // Each block's tensors are allocated one by one, each rounded to the caching allocator's granule.
  const auto rounded = [](int64_t bytes) { return static_cast<int64_t>(CachingAllocator::rounded_size(static_cast<size_t>(bytes))); };
  int64_t compute = 0;
  for (int64_t n : {4096LL * 4096, 4096LL * 4096, 4096LL * 4096, 4096LL * 4096, 4096LL * 11008, 4096LL * 11008,
                    4096LL * 11008, 4096LL, 4096LL})
    compute += rounded(2 * n);
  EXPECT_EQ(item(b, "trainable compute copies"), 8 * compute);
  EXPECT_EQ(item(b, "fp32 masters + grads + optimizer state"), 8 * 4 * rounded(4 * block));
  EXPECT_GE(b.activations.unit_grads, 4 * block);
  // The activations of 40 layers (the stream) against 32: the rest is the blocks' weights and state.
  EXPECT_GT(b.gpu_peak - a.gpu_peak, 8 * (compute + 4 * 4 * block));
  EXPECT_NEAR(b.gpu_peak / kGiB, 33.1, 0.5);  // what `fsdpq plan` prints for it (bs 4, ctx 512)
  // Sharded over 4 GPUs each holds about a quarter of the blocks' state.
  pro.world_size = 4;
  const MemoryPrediction four = predict_memory(pro);
  EXPECT_NEAR(static_cast<double>(item(four, "fp32 masters + grads + optimizer state")), 8.0 * 4 * 4 * block / 4,
              0.05 * 8 * 4 * 4 * block / 4);
}

// The planner's activation bytes against the CPU tensors a real training pass allocates: the
// first pass adds the persistent buffers (dequantised layer, RoPE tables), and the peak of a
// pass above what was live before it is exactly the transient activations.
struct PassCase {
  const char* name;
  bool quantize, train_base, checkpointing;
  double dropout;
  Precision precision;
  int64_t B, T;
  int64_t checkpoint_every = 1;
  bool dora = false;
  int64_t new_blocks = 0;  // Llama-Pro (quantize: the frozen layers NF4)
  bool lora_fold = false;  // FSDPQ_LORA_FOLD: wider dequantised buffers, [x | xa] in the forward
  int64_t keep_dequantized = 0;  // keep_dequantized_layers
  int64_t keep_activations = 0;  // keep_activation_layers
  bool activation_offload = false;  // use_activation_cpu_offload
  int64_t layers = 0;  // 0: tiny_llama's 2
};

// DoRA adds per adapted linear a magnitude [out] with its fp32 master, gradient and AdamW state,
// and per layer the saved z [N, out], xa [N, r] per module and the weight norms.
TEST(MemoryPlan, DoraCountsMagnitudesTheirStateAndSavedTensors) {
  PlanInput p = llama2_7b(true);
  p.on_gpu = false;  // host bytes are not rounded: exact differences
  p.setting.cpu_offload = true;  // the fp32 master, gradient and optimizer state on the host
  const MemoryPrediction lora = predict_memory(p);
  const ActivationBytes lora_activations = activation_bytes(p);
  p.dora = true;
  const MemoryPrediction dora = predict_memory(p);
  const ActivationBytes dora_activations = activation_bytes(p);
  // q, k, v, down: 4096 rows; gate, up: 11008; 32 layers.
  const int64_t magnitudes = 32 * (4 * 4096 + 2 * 11008);
  EXPECT_GE(dora.host_per_rank - lora.host_per_rank, 4 * 4 * magnitudes);
  // N = 4 · 512 tokens: z of each adapted module (bf16) replaces nothing; xa per module replaces the groups'.
  const int64_t N = 4 * 512;
  EXPECT_EQ(dora_activations.layer - lora_activations.layer, N * (4 * 4096 + 2 * 11008) * 2 + (4 * 4096 + 2 * 11008) * 4);
  EXPECT_GT(dora_activations.peak, lora_activations.peak);
}

TEST(MemoryPlan, ActivationBytesEqualWhatACpuPassAllocates) {
  const PassCase cases[] = {
      {"qlora bf16 ckpt dropout", true, false, true, 0.1, Precision::BF16, 2, 24},
      {"qlora bf16 no ckpt", true, false, false, 0.1, Precision::BF16, 3, 16},
      {"lora fp32 ckpt no dropout", false, false, true, 0.0, Precision::FP32, 2, 20},
      {"lora fp16 no ckpt", false, false, false, 0.05, Precision::FP16Autocast, 1, 40},
      {"full bf16 ckpt", false, true, true, 0.0, Precision::BF16, 2, 16},
      {"qlora bf16 ckpt every 2nd layer", true, false, true, 0.1, Precision::BF16, 2, 24, 2},
      {"lora fp32 ckpt every 3rd layer", false, false, true, 0.0, Precision::FP32, 2, 20, 3},
      {"bnb_dora bf16 ckpt no dropout", true, false, true, 0.0, Precision::BF16, 2, 24, 1, true},
      {"bnb_dora bf16 no ckpt dropout", true, false, false, 0.1, Precision::BF16, 3, 16, 1, true},
      {"dora fp32 ckpt dropout", false, false, true, 0.1, Precision::FP32, 2, 20, 1, true},
      {"bnb_llama_pro bf16 ckpt", true, false, true, 0.0, Precision::BF16, 2, 24, 1, false, 2},
      {"bnb_llama_pro fp32 no ckpt", true, false, false, 0.0, Precision::FP32, 2, 16, 1, false, 1},
      {"qlora bf16 ckpt dropout folded", true, false, true, 0.1, Precision::BF16, 2, 24, 1, false, 0, true},
      {"qlora fp32 no ckpt folded", true, false, false, 0.0, Precision::FP32, 3, 16, 1, false, 0, true},
      {"qlora bf16 no ckpt folded, 2 layers keep theirs", true, false, false, 0.1, Precision::BF16, 2, 16, 1, false, 0, true, 2},
      {"qlora bf16 ckpt, every layer keeps its own", true, false, true, 0.1, Precision::BF16, 2, 16, 1, false, 0, false, 9},
      {"bnb_dora bf16 no ckpt, 1 layer keeps its own", true, false, false, 0.1, Precision::BF16, 2, 16, 1, true, 0, false, 1},
      {"bnb_llama_pro bf16 no ckpt, 2 layers keep theirs", true, false, false, 0.0, Precision::BF16, 2, 16, 1, false, 2, false, 2},
      {"qlora bf16 ckpt, the last 2 layers not recomputed", true, false, true, 0.1, Precision::BF16, 2, 16, 1, false, 0, true, 0, 2},
      {"qlora bf16 ckpt, the last 1 layer not recomputed, not folded", true, false, true, 0.1, Precision::BF16, 2, 16, 1, false, 0, false, 0, 1},
      {"qlora bf16 ckpt, folded, the last 1 layer not recomputed", true, false, true, 0.1, Precision::BF16, 2, 16, 1, false, 0, true, 0, 1},
      {"lora fp32 ckpt every 2nd layer, the last 1 not recomputed", false, false, true, 0.0, Precision::FP32, 2, 20, 2, false, 0, false, 0, 1},
      {"qlora bf16 ckpt, activation offload", true, false, true, 0.1, Precision::BF16, 2, 24, 1, false, 0, false, 0, 0, true},
      {"qlora bf16 ckpt, folded, activation offload, the last 1 not recomputed", true, false, true, 0.1, Precision::BF16, 2, 16, 1, false, 0, true, 0, 1, true},
      {"qlora bf16 ckpt, activation offload, 5 layers, the last 3 not recomputed", true, false, true, 0.1, Precision::BF16, 2, 24, 1, false, 0, false, 0, 3, true, 5},
      {"qlora bf16 ckpt every 2nd layer, folded, activation offload, 6 layers", true, false, true, 0.1, Precision::BF16, 2, 16, 2, false, 0, true, 0, 0, true, 6},
      {"bnb_dora bf16 ckpt, activation offload, 4 layers, the last 3 not recomputed", true, false, true, 0.1, Precision::BF16, 2, 16, 1, true, 0, false, 0, 3, true, 4},
      {"lora fp32 ckpt every 3rd layer, activation offload, 7 layers, the last 1 not recomputed", false, false, true, 0.0, Precision::FP32, 2, 20, 3, false, 0, false, 0, 1, true, 7},
      {"qlora fp16 ckpt, activation offload, 4 layers, the last 2 not recomputed", true, false, true, 0.1, Precision::FP16Autocast, 2, 16, 1, false, 0, false, 0, 2, true, 4},
  };
  const bool saved_fold = lora_fold();
  for (const PassCase& c : cases) {
    SCOPED_TRACE(c.name);
    set_lora_fold(c.lora_fold);
    LlamaConfig config = test::tiny_llama(300);
    if (c.layers > 0) config.num_hidden_layers = c.layers;
    ModelOptions o = c.train_base ? test::full_options(c.precision) : test::lora_options(c.precision, c.quantize, c.dropout);
    if (c.new_blocks > 0) {
      o.lora_targets = {};
      o.llama_pro_new_blocks = c.new_blocks;
    }
    o.gradient_checkpointing = c.checkpointing;
    o.checkpoint_every = c.checkpoint_every;
    o.use_dora = c.dora;
    o.keep_dequantized_layers = c.keep_dequantized;
    o.keep_activation_layers = c.keep_activations;
    o.activation_offload = c.activation_offload;
    LlamaModel model = LlamaModel::random(config, 1, o);
    const data::Batch batch = test::random_batch(c.B, c.T, config.vocab_size, 7);

    PlanInput p;
    p.model = model.config();  // with Llama-Pro's new blocks
    p.new_blocks = c.new_blocks;
    p.quantized = c.quantize;
    p.train_base = c.train_base;
    p.lora_rank = o.lora_rank;
    p.lora_targets = o.lora_targets;
    p.lora_dropout = c.dropout;
    p.dora = c.dora;
    p.activation = activation_dtype(c.precision);
    p.context_length = c.T;
    p.on_gpu = false;
    p.grads_per_unit = false;  // a bare model's gradients exist all the time
    p.setting.batch_size = c.B;
    p.setting.gradient_checkpointing = c.checkpointing;
    p.setting.checkpoint_every = c.checkpoint_every;
    p.setting.keep_dequantized_layers = c.keep_dequantized;
    p.setting.keep_activation_layers = c.keep_activations;
    p.setting.activation_offload = c.activation_offload;
    const ActivationBytes predicted = activation_bytes(p);

    const int64_t before_first = host_tensor_bytes().live;
    reset_host_tensor_peak();
    model.forward_backward(batch, 100.0, 1.0f, 1);
    const HostTensorBytes after_first = host_tensor_bytes();
    EXPECT_EQ(after_first.live - before_first, predicted.dequantized + predicted.rope);
    EXPECT_EQ(after_first.peak - before_first, predicted.peak);

    reset_host_tensor_peak();
    model.forward_backward(batch, 100.0, 1.0f, 2);
    const HostTensorBytes after_second = host_tensor_bytes();
    EXPECT_EQ(after_second.live, after_first.live);
    EXPECT_EQ(after_second.peak - after_first.live, predicted.transient_peak);
    EXPECT_GT(predicted.transient_peak, predicted.kept_layers * predicted.layer);
  }
  set_lora_fold(saved_fold);
}

test::CommandResult plan(const std::string& args) {
  return test::run_command(std::string("cd '") + FSDPQ_SOURCE_DIR + "' && '" + FSDPQ_BINARY + "' plan " + args);
}

TEST(PlanCommand, PrintsTheGuideAndRecommends) {
  const auto r = plan("inputs/dummy_7b.ini --gpus 1 --gpu-mem 80 --host-mem 256");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* part : {"fsdpq plan: preset:llama2-7b (32 layers, hidden 4096, vocab 32000), qlora r 64",
                           "1 GPU of 80 GiB, 1 rank per node, host memory 256 GiB per node",
                           "| # | step | setting | batch |", "| 1 | DDP | ddp + ",
                           "| 2 | + selective recompute | ddp + elementwise recompute + ", "| 7 | + activation offload |",
                           "layers kept dense |", "Recommended: step 1 (DDP)", "--keep_dequantized_layers "})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << "\n" << r.output;
  // 70B QLoRA fits one 24 GiB GPU only with CPU offload, which streams the layers' NF4 weights
  // from host memory; in 4 GiB nothing fits (the head and embedding alone take 1 GiB, the adapters 1.5, and ctx
  // 2048's activations most of the rest).
  const auto offload = plan("inputs/dummy_70b.ini --gpus 1 --gpu-mem 24");
  ASSERT_EQ(offload.exit_code, 0) << offload.output;
  EXPECT_NE(offload.output.find("Recommended: step 6 (+ CPU offload)"), std::string::npos) << offload.output;
  // It recomputes layers without activation offload: the plan says what the offload would free and cost.
  EXPECT_NE(offload.output.find("With use_activation_cpu_offload = true this setting would free "), std::string::npos)
      << offload.output;
  // Where the host memory given is too small for it, it says so.
  const auto small_host = plan("inputs/dummy_70b.ini --gpus 1 --gpu-mem 24 --host-mem 64");
  ASSERT_EQ(small_host.exit_code, 0) << small_host.output;
  EXPECT_NE(small_host.output.find("Recommended: step 6 (+ CPU offload)"), std::string::npos) << small_host.output;
  EXPECT_NE(small_host.output.find("more than the 64 GiB given)"), std::string::npos) << small_host.output;
  EXPECT_EQ(offload.output.find("GiB given)"), std::string::npos) << offload.output;  // (host not given there)
  const auto none = plan("inputs/dummy_70b.ini --gpus 1 --gpu-mem 4");
  ASSERT_EQ(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("Nothing fits in 4 GiB per GPU"), std::string::npos) << none.output;
}

// What the batch counts, and when packing pays (docs/packing.md).
TEST(PlanCommand, SaysWhatTheBatchCountsWithAndWithoutPacking) {
  const auto unpacked = plan("inputs/dummy_7b.ini --gpus 1 --gpu-mem 80");
  ASSERT_EQ(unpacked.exit_code, 0) << unpacked.output;
  EXPECT_NE(unpacked.output.find("The batch counts examples"), std::string::npos) << unpacked.output;
  EXPECT_NE(unpacked.output.find("packing = true pays"), std::string::npos) << unpacked.output;
  const auto packed = plan("inputs/dummy_7b.ini --gpus 1 --gpu-mem 80 --packing true");
  ASSERT_EQ(packed.exit_code, 0) << packed.output;
  EXPECT_NE(packed.output.find("Packing is on: the batch counts rows"), std::string::npos) << packed.output;
  EXPECT_EQ(packed.output.find("The batch counts examples"), std::string::npos) << packed.output;
  const auto free = plan("inputs/dummy_7b.ini --gpus 1 --gpu-mem 80 --pad_to_context_length false --padding_free true");
  ASSERT_EQ(free.exit_code, 0) << free.output;
  EXPECT_NE(free.output.find("padding_free is on: each micro-batch's examples are laid end to end in one row"),
            std::string::npos)
      << free.output;
  EXPECT_EQ(free.output.find("The batch counts examples"), std::string::npos) << free.output;
}

TEST(PlanCommand, BadFlagsAreClearErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"inputs/dummy_7b.ini --gpus 0", "plan: --gpus '0': expected an integer from 1 to 1048576"},
      {"inputs/dummy_7b.ini --gpus two", "plan: --gpus 'two': expected an integer from 1 to 1048576"},
      {"inputs/dummy_7b.ini --gpu-mem abc", "plan: --gpu-mem 'abc': expected a number of GiB above 0"},
      {"inputs/dummy_7b.ini --host-mem=-4", "plan: --host-mem '-4': expected a number of GiB above 0"},
      {"inputs/dummy_7b.ini --gpu-mem", "plan: --gpu-mem needs a value"},
      {"inputs/dummy_7b.ini --max-batch 0", "plan: --max-batch '0': expected an integer from 1 to 65536"},
      {"inputs/dummy_7b.ini --ranks_per_node 8 --gpus 4", "plan: ranks_per_node = 8 is more than the 4 GPUs"},
      {"inputs/nope.ini", "nope.ini"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = plan(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace fsdpq
