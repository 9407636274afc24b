// Llama-Pro block expansion (model/block_expansion.h): where the new blocks go and what they start
// as; that the expanded model computes exactly what the original does until they train; that they
// are the only weights that train, and that training leaves every frozen byte as it was.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/section_times.h"
#include "model/block_expansion.h"
#include "model/llama_model.h"
#include "model/llama_weights.h"
#include "model_llama_test_support.h"
#include "util/error.h"

namespace fsdpq {
namespace {

TEST(BlockExpansion, ANewBlockFollowsEveryLOverNOriginalLayersAndCopiesTheOneBefore) {
  const BlockExpansion e(4, 2);
  EXPECT_EQ(e.layers(), 6);
  EXPECT_EQ(e.new_layers(), (std::vector<int64_t>{2, 5}));
  const std::vector<int64_t> sources = {0, 1, 1, 2, 3, 3};
  for (int64_t layer = 0; layer < e.layers(); ++layer) EXPECT_EQ(e.source_layer(layer), sources[layer]) << layer;
  // fsdp_qlora's train.py: new_layer_ids = [split + (split + 1) * n for n in range(new)], split = L / new.
  for (const auto& [L, n] :
       std::vector<std::pair<int64_t, int64_t>>{{32, 8}, {32, 4}, {32, 32}, {6, 1}, {2, 2}, {40, 5}, {32, 3}, {32, 6}}) {
    const int64_t split = L / n;
    std::vector<int64_t> want;
    for (int64_t k = 0; k < n; ++k) want.push_back(split + (split + 1) * k);
    EXPECT_EQ(BlockExpansion(L, n).new_layers(), want) << L << " layers, " << n << " new";
  }
  const BlockExpansion none(4, 0);
  EXPECT_EQ(none.layers(), 4);
  EXPECT_TRUE(none.new_layers().empty());
  for (int64_t layer = 0; layer < 4; ++layer) EXPECT_EQ(none.source_layer(layer), layer);
}

// fsdp_qlora's default expansion_rate 0.1 on 32 layers: 3 blocks after layers 9, 19 and 29 (split
// 10), the last two original layers after the last new block.
TEST(BlockExpansion, ACountThatLeavesLayersOverPutsThemAfterTheLastNewBlock) {
  const BlockExpansion e(32, 3);
  EXPECT_EQ(e.layers(), 35);
  EXPECT_EQ(e.new_layers(), (std::vector<int64_t>{10, 21, 32}));
  std::vector<int64_t> want;
  for (int64_t group = 0; group < 3; ++group) {
    for (int64_t i = 0; i < 10; ++i) want.push_back(10 * group + i);
    want.push_back(10 * group + 9);  // the new block copies the group's last layer
  }
  want.push_back(30);
  want.push_back(31);
  for (int64_t layer = 0; layer < e.layers(); ++layer) EXPECT_EQ(e.source_layer(layer), want[layer]) << layer;
}

// Counts for which fsdp_qlora's placement does not add exactly n blocks (4 layers, n = 3: split 1
// puts a block after every layer, 4 of them) are refused, naming those that work.
TEST(BlockExpansion, RefusesACountTheLayersDoNotTake) {
  for (int64_t n : {3, 5, 8, -1}) {
    try {
      BlockExpansion(4, n);
      ADD_FAILURE() << n << " new blocks on 4 layers were accepted";
    } catch (const UserError& e) {
      EXPECT_EQ(std::string(e.what()),
                fmt::format("llama_pro_num_new_blocks = {}: Llama-Pro puts a new block after every ⌊L / n⌋ of the "
                            "model's L = 4 decoder layers (fsdp_qlora's block_expansion.py), which adds exactly n "
                            "blocks for n in 1, 2, 4",
                            n));
    }
  }
  EXPECT_EQ(BlockExpansion::problem(32, 8), "");
  EXPECT_EQ(BlockExpansion::problem(32, 3), "");
  EXPECT_NE(BlockExpansion::problem(32, 7), "") << "split 4 would put 8 blocks";
  EXPECT_NE(BlockExpansion::problem(10, 4), "") << "split 2 would put 5 blocks";
}

// The values a WeightSource gives for a whole tensor, as floats.
std::vector<float> read_whole(const WeightSource& source, const std::vector<TensorSpec>& specs, const std::string& name) {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].name == name) {
      int64_t n = 1;
      for (int64_t d : specs[i].shape) n *= d;
      std::vector<float> v(static_cast<size_t>(n));
      source(specs[i], i, 0, TensorView{v.data(), DType::F32, Shape{n}});
      return v;
    }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

TEST(BlockExpansion, TheExpandedSourceReadsEachLayerFromItsSourceAndZeroesTheNewBlocksResidualWrites) {
  LlamaConfig original = test::tiny_llama();
  original.num_hidden_layers = 5;
  const BlockExpansion e(5, 2);  // split 2: blocks at 2 and 5, original layer 4 last
  const WeightSource base = random_weight_source(7, 0.1f);
  const WeightSource expanded = expanded_weight_source(e, original, base);
  const std::vector<TensorSpec> original_specs = hf_tensor_specs(original);
  const std::vector<TensorSpec> expanded_specs = hf_tensor_specs(e.expanded(original));
  const std::vector<std::string> modules = {"input_layernorm",   "self_attn.q_proj", "self_attn.k_proj",
                                            "self_attn.v_proj",  "self_attn.o_proj", "post_attention_layernorm",
                                            "mlp.gate_proj",     "mlp.up_proj",      "mlp.down_proj"};
  for (int64_t layer = 0; layer < e.layers(); ++layer)
    for (const std::string& module : modules) {
      SCOPED_TRACE(fmt::format("layer {} {}", layer, module));
      const std::vector<float> got =
          read_whole(expanded, expanded_specs, fmt::format("model.layers.{}.{}.weight", layer, module));
      std::vector<float> want = read_whole(
          base, original_specs, fmt::format("model.layers.{}.{}.weight", e.source_layer(layer), module));
      if (e.is_new(layer) && (module == "self_attn.o_proj" || module == "mlp.down_proj")) {
        std::fill(want.begin(), want.end(), 0.0f);
      } else {
        ASSERT_FALSE(std::all_of(want.begin(), want.end(), [](float v) { return v == 0.0f; }));
      }
      EXPECT_EQ(got, want);
    }
  for (const char* name : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"})
    EXPECT_EQ(read_whole(expanded, expanded_specs, name), read_whole(base, original_specs, name)) << name;
}

// ---- The expanded model ------------------------------------------------------------------------

struct LlamaProCase {
  const char* name;
  int hqq_bits;  // 0: NF4 (bnb_llama_pro)
  Precision precision;
};

LlamaConfig four_layers() {
  LlamaConfig config = test::tiny_llama(300, 0.1);
  config.num_hidden_layers = 4;
  return config;
}

ModelOptions llama_pro_options(const LlamaProCase& c, int64_t new_blocks) {
  ModelOptions o;
  o.quantize_base = true;
  o.hqq_bits = c.hqq_bits;
  o.train_base = false;
  o.lora_targets = {};
  o.llama_pro_new_blocks = new_blocks;
  o.precision = c.precision;
  o.gradient_checkpointing = true;
  return o;
}

// Every frozen weight's bytes, by name.
std::map<std::string, std::vector<uint8_t>> frozen_bytes(LlamaModel& model) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (ParamUnit& unit : model.param_units())
    for (BaseWeight* w : unit.frozen)
      for (size_t i = 0; i < w->frozen.segments().size(); ++i) {
        const std::span<const uint8_t> bytes = std::as_const(w->frozen).segment(i);
        out[w->name + "#" + std::to_string(i)].assign(bytes.begin(), bytes.end());
      }
  return out;
}

class LlamaPro : public ::testing::TestWithParam<LlamaProCase> {};

TEST_P(LlamaPro, TheExpandedModelComputesExactlyWhatTheOriginalDoes) {
  const LlamaConfig config = four_layers();
  LlamaModel original = LlamaModel::random(config, 17, llama_pro_options(GetParam(), 0));
  for (int64_t n : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(n) + " new blocks");
    LlamaModel expanded = LlamaModel::random(config, 17, llama_pro_options(GetParam(), n));
    EXPECT_EQ(expanded.config().num_hidden_layers, 4 + n);
    EXPECT_EQ(expanded.num_units(), 4 + n + 1);
    const data::Batch batch = test::random_batch(2, 12, config.vocab_size, 5);
    EXPECT_TRUE(test::same_bits(expanded.logits(batch), original.logits(batch)));
    const LossSum want = original.evaluate(batch), got = expanded.evaluate(batch);
    EXPECT_EQ(got.loss_sum, want.loss_sum);
    EXPECT_EQ(got.tokens, want.tokens);
  }
  // 5 layers, 2 new blocks: split 2, the fifth layer after the last new block.
  LlamaConfig five = config;
  five.num_hidden_layers = 5;
  LlamaModel original5 = LlamaModel::random(five, 17, llama_pro_options(GetParam(), 0));
  LlamaModel expanded5 = LlamaModel::random(five, 17, llama_pro_options(GetParam(), 2));
  EXPECT_EQ(expanded5.config().num_hidden_layers, 7);
  const data::Batch batch = test::random_batch(2, 12, config.vocab_size, 6);
  EXPECT_TRUE(test::same_bits(expanded5.logits(batch), original5.logits(batch)));
}

TEST_P(LlamaPro, OnlyTheNewBlocksTrainAndEveryFrozenByteStays) {
  const LlamaConfig config = four_layers();
  LlamaModel model = LlamaModel::random(config, 17, llama_pro_options(GetParam(), 2));
  // Every weight of layers 2 and 5 (the copies of 1 and 3), nothing else.
  std::set<std::string> want;
  for (int64_t layer : {2, 5})
    for (const char* module : {"input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                               "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
                               "mlp.down_proj"})
      want.insert(fmt::format("model.layers.{}.{}.weight", layer, module));
  std::set<std::string> trainable;
  std::map<std::string, std::vector<float>> initial;
  for (const TrainableParameter& p : model.trainable_parameters()) {
    trainable.insert(p.name);
    initial[p.name] = test::floats_of(*p.master);
  }
  EXPECT_EQ(trainable, want);
  const auto frozen_before = frozen_bytes(model);
  EXPECT_EQ(frozen_before.size() > 0, true);

  // 30 AdamW steps on one batch (as model_llama_training_test.cpp): two new blocks can fit it.
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 18);
  const test::LossBeforeAndAfter loss = test::train_on_one_batch(model, batch);
  EXPECT_LT(loss.final, 0.5 * loss.initial) << "initial " << loss.initial << " final " << loss.final;
  EXPECT_EQ(frozen_bytes(model), frozen_before);
  for (const TrainableParameter& p : model.trainable_parameters())
    EXPECT_NE(test::floats_of(*p.master), initial.at(p.name)) << p.name << " did not train";
}

// The frozen layers under the first new block have no gradient of their own and nothing below them
// trains: their backward (and, checkpointed, its recompute) is not run. 4 layers + 2 new blocks
// (layers 2 and 5): of each layer's seven "linear bwd" sections (q, k, v, o, gate, up, down) only
// layers 2 to 5 run theirs, and the recompute (three "linear" sections a layer: it stops at h)
// runs in layers 2 to 4 alone (layer 5, the last, is not recomputed), beside the forward's four a layer. The new blocks' gradients are what
// OnlyTheNewBlocksTrainAndEveryFrozenByteStays trains with, and the rank-equivalence suites compare.
TEST_P(LlamaPro, TheLayersUnderTheFirstNewBlockRunNoBackward) {
  const LlamaConfig config = four_layers();
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "checkpointing" : "no checkpointing");
    ModelOptions options = llama_pro_options(GetParam(), 2);
    options.gradient_checkpointing = checkpointing;
    LlamaModel model = LlamaModel::random(config, 17, options);
    const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 19);
    set_section_times_enabled(true);
    reset_section_times();
    model.forward_backward(batch, 1.0, 1.0f, 0);
    int64_t linear = 0, linear_bwd = 0, norm_bwd = 0;
    for (const SectionTotal& t : section_totals()) {
      if (t.name == std::string("linear")) linear = t.count;
      if (t.name == std::string("linear bwd")) linear_bwd = t.count;
      if (t.name == std::string("rmsnorm + residual bwd")) norm_bwd = t.count;
    }
    set_section_times_enabled(false);
    reset_section_times();
    EXPECT_EQ(linear_bwd, 7 * 4);
    EXPECT_EQ(norm_bwd, 2 * 4);
    EXPECT_EQ(linear, 4 * 6 + (checkpointing ? 3 * 3 : 0));
  }
}

INSTANTIATE_TEST_SUITE_P(Bases, LlamaPro,
                         ::testing::Values(LlamaProCase{"nf4_bf16", 0, Precision::BF16},
                                           LlamaProCase{"nf4_fp32", 0, Precision::FP32},
                                           LlamaProCase{"hqq4_bf16", 4, Precision::BF16},
                                           LlamaProCase{"hqq2_fp16_autocast", 2, Precision::FP16Autocast}),
                         [](const ::testing::TestParamInfo<LlamaProCase>& info) { return std::string(info.param.name); });

TEST(LlamaPro, RefusesLoraAdaptersOrFullFineTuningBesideTheNewBlocks) {
  ModelOptions o = llama_pro_options({"nf4", 0, Precision::BF16}, 2);
  o.lora_targets = {"q_proj"};
  EXPECT_THROW(LlamaModel::random(four_layers(), 1, o), UserError);
  o = llama_pro_options({"nf4", 0, Precision::BF16}, 3);
  EXPECT_THROW(LlamaModel::random(four_layers(), 1, o), UserError);
}

}  // namespace
}  // namespace fsdpq
