// ShardedTrainingState::first_non_finite_gradient on 2 ranks: after a pass that made the gradients NaN, it
// names the first trainable tensor in unit order whose gradient (on whichever rank's shard) is not
// finite, the same on every rank; with finite gradients it finds none.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <limits>
#include <string>

#include "data/collate.h"
#include "fsdp/fsdp.h"
#include "fsdp/process_groups.h"
#include "fsdp/shard_loader.h"
#include "model/llama_model.h"
#include "model/presets.h"
#include "runtime/world.h"

namespace fsdpq {
namespace {

LlamaConfig small_config() {
  LlamaConfig config = preset_or_fail("tiny");
  config.vocab_size = 96;
  return config;
}

data::Batch small_batch() {
  data::Batch b;
  b.batch_size = 1;
  b.seq_len = 12;
  for (int32_t t = 0; t < 12; ++t) {
    b.input_ids.push_back(3 + (t * 7) % 90);
    b.labels.push_back(t < 4 ? data::kIgnoreIndex : b.input_ids.back());
  }
  b.target_tokens = 7;  // positions 5..11 (position 0 never counts; 4 is the first label at t >= 4)
  return b;
}

struct PassResult {
  std::string first_bad;
  double norm = 0;
};

// A LoRA model on 2 ranks (full_shard); `poison`, when not empty, is a trainable tensor whose
// master gets a NaN before the pass.
PassResult run_pass(const std::string& poison) {
  const World world = describe_world(detect_launcher());
  ProcessGroups groups = make_process_groups(world, ShardingStrategy::FullShard, 0);
  ModelOptions options;
  options.lora_rank = 4;
  options.precision = Precision::FP32;
  options.lora_targets = {"q_proj", "v_proj", "down_proj"};
  const LlamaConfig config = small_config();
  Fsdp fsdp(groups, {.compute_dtype = DType::F32}, static_cast<int>(config.num_hidden_layers) + 1);
  LlamaModel model = LlamaModel::random(config, 5, options, shard_loader(world, fsdp));
  fsdp.attach(model);
  if (!poison.empty()) {
    fsdp.state().for_each_trainable([&](TrainableShard& t) {
      if (t.name == poison && !t.master.empty()) t.master[0] = std::numeric_limits<float>::quiet_NaN();
    });
    fsdp.masters_loaded(0);  // the compute copies follow the masters
  }
  const data::Batch batch = small_batch();
  model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 0);
  PassResult r;
  r.norm = fsdp.state().grad_norm();
  if (!std::isfinite(r.norm)) r.first_bad = fsdp.state().first_non_finite_gradient();
  return r;
}

TEST(GradientCheck, TheFirstNonFiniteGradientIsNamedAlikeOnEveryRank) {
  const PassResult clean = run_pass("");
  EXPECT_TRUE(std::isfinite(clean.norm));
  EXPECT_GT(clean.norm, 0.0);

  // A NaN weight in layer 1 makes the loss, and so every gradient, NaN: the first in unit order is
  // layer 0's first adapter, whatever rank holds it.
  const PassResult poisoned = run_pass("base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight");
  EXPECT_TRUE(std::isnan(poisoned.norm));
  EXPECT_EQ(poisoned.first_bad, "tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight'");
  // Every rank got the same answer.
  int length = static_cast<int>(poisoned.first_bad.size()), longest = 0;
  MPI_Allreduce(&length, &longest, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(length, longest);
}

}  // namespace
}  // namespace fsdpq
