// The start-up hint's count (app/kept_layers_hint.h): offered only for a quantised base that keeps
// no dense layers, and then what fits in 90% of the GPU by the plan.
#include "app/kept_layers_hint.h"

#include <gtest/gtest.h>

#include "model/presets.h"

namespace fsdpq {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

// fsdp_qlora's 7B QLoRA settings (the struct's own defaults are zeros: the loader fills them).
TrainConfig qlora_7b() {
  TrainConfig c;
  c.train_type = "qlora";
  c.choice.train_type = TrainType::Qlora;
  c.lora_rank = 64;
  c.lora_target_modules = {"q_proj", "k_proj", "v_proj", "up_proj", "down_proj", "gate_proj"};
  c.context_length = 2048;
  c.batch_size = 1;
  c.use_gradient_checkpointing = true;
  return c;
}

PlanInput seven_b(const TrainConfig& c) {
  PlanInput p = plan_input_from(c, preset_or_fail("llama2-7b"), 1);
  p.on_gpu = true;
  return p;
}

TEST(KeptLayersHint, OffersWhatFitsInNinetyPercentOfTheGpu) {
  const TrainConfig c = qlora_7b();  // bs 1, checkpointing on: a small run on a large card
  const PlanInput p = seven_b(c);
  const int64_t offered = kept_layers_to_suggest(c, p, 80 * kGiB);
  EXPECT_EQ(offered, most_kept_dense_layers(p, static_cast<int64_t>(0.9 * 80 * kGiB)));
  EXPECT_EQ(offered, p.model.num_hidden_layers);  // 32 x 0.39 GiB fit beside ~8 GiB
  EXPECT_LT(kept_layers_to_suggest(c, p, 12 * kGiB), offered);  // a smaller card: fewer
  EXPECT_EQ(kept_layers_to_suggest(c, p, 0), 0);  // no GPU figure
}

TEST(KeptLayersHint, SilentWhereTheConfigKeepsSomeOrHasNoQuantisedBase) {
  TrainConfig c = qlora_7b();
  c.keep_dequantized_layers = 4;
  EXPECT_EQ(kept_layers_to_suggest(c, seven_b(c), 80 * kGiB), 0);
  TrainConfig lora = qlora_7b();
  lora.train_type = "lora";
  lora.choice.train_type = TrainType::Lora;
  EXPECT_EQ(kept_layers_to_suggest(lora, seven_b(lora), 80 * kGiB), 0);
}

// With checkpointing on every layer the hint offers layers not recomputed first (a layer's forward
// saved each): as many as fit in 90% of the card (one more would not), none where the config keeps
// some, checkpoints every k-th layer, or does not checkpoint.
TEST(KeptLayersHint, OffersLayersNotRecomputedWhereEveryLayerIs) {
  TrainConfig c = qlora_7b();
  c.batch_size = 8;
  const PlanInput p = seven_b(c);
  const int64_t offered = activation_layers_to_suggest(c, p, 80 * kGiB);
  ASSERT_GT(offered, 0);
  ASSERT_LT(offered, p.model.num_hidden_layers);  // bs 8 at ctx 2048: not all of them fit in 72 GiB
  PlanInput at = p;
  at.setting.keep_activation_layers = offered;
  EXPECT_LE(predict_memory(at).gpu_required, static_cast<int64_t>(0.9 * 80 * kGiB));
  at.setting.keep_activation_layers = offered + 1;
  EXPECT_GT(predict_memory(at).gpu_required, static_cast<int64_t>(0.9 * 80 * kGiB));
  for (auto change : {+[](TrainConfig& t) { t.keep_activation_layers = 2; }, +[](TrainConfig& t) { t.checkpoint_every = 2; },
                      +[](TrainConfig& t) { t.use_gradient_checkpointing = false; }}) {
    TrainConfig other = c;
    change(other);
    EXPECT_EQ(activation_layers_to_suggest(other, seven_b(other), 80 * kGiB), 0);
  }
}

}  // namespace
}  // namespace fsdpq
