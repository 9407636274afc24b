// fsdpq's half of the HF + PEFT training parity check (tests/reference/hf_train_parity.py runs
// the other half and compares). With FSDPQ_HF_PARITY_DIR set, it reads DIR/model (an init-model
// directory), DIR/adapter (PEFT, random A and B) and DIR/batch.json ({"input_ids": [[...]],
// "labels": [[...]], "precision": "bf16" | "fp32"}), runs one training pass on the GPU with
// dropout 0 for train_type lora and qlora — or, for a DoRA adapter (use_dora), for DoRA over the
// dense base ("dora") and bnb_dora — and writes DIR/fsdpq_<train_type>.json:
// {"loss": mean, "tokens", "logits": [B*T*V, fp32], "grads": {PEFT name: [values]}}. The
// gradients are of the mean loss (HF's loss.backward()). Skipped without the variable.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/op_parity.h"
#include "io/model_files.h"
#include "io/peft_adapter.h"
#include "model/llama_config.h"
#include "model/llama_model.h"
#include "ops/cross_entropy.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;

data::Batch read_batch(const nlohmann::json& j) {
  data::Batch batch;
  const auto& ids = j.at("input_ids");
  const auto& labels = j.at("labels");
  batch.batch_size = static_cast<int64_t>(ids.size());
  batch.seq_len = static_cast<int64_t>(ids.at(0).size());
  for (size_t b = 0; b < ids.size(); ++b)
    for (size_t t = 0; t < ids[b].size(); ++t) {
      batch.input_ids.push_back(ids[b][t].get<int32_t>());
      batch.labels.push_back(labels[b][t].get<int32_t>());
      if (t > 0 && batch.labels.back() != kIgnoreIndex) ++batch.target_tokens;
    }
  return batch;
}

TEST(GpuHfParity, WritesLossLogitsAndLoraGradients) {
  const char* dir_env = std::getenv("FSDPQ_HF_PARITY_DIR");
  if (!dir_env) GTEST_SKIP() << "FSDPQ_HF_PARITY_DIR not set: run tests/reference/hf_train_parity.py";
  test::use_gpu();
  const fs::path dir = dir_env;
  std::ifstream batch_file(dir / "batch.json");
  ASSERT_TRUE(batch_file) << dir / "batch.json";
  const nlohmann::json batch_json = nlohmann::json::parse(batch_file);
  const data::Batch batch = read_batch(batch_json);
  const LlamaConfig config = load_llama_config(dir / "model" / "config.json");
  const LoadedAdapter adapter = load_peft_adapter(dir / "adapter");
  ModelWeights weights = ModelWeights::open(dir / "model");

  const bool dora = adapter.config.use_dora;
  for (const std::string train_type : dora ? std::vector<std::string>{"dora", "bnb_dora"}
                                           : std::vector<std::string>{"lora", "qlora"}) {
    SCOPED_TRACE(train_type);
    ModelOptions options;
    options.quantize_base = train_type == "qlora" || train_type == "bnb_dora";
    options.use_dora = dora;
    options.lora_rank = adapter.config.r;
    options.lora_alpha = adapter.config.lora_alpha;
    options.lora_dropout = 0.0;
    options.lora_targets = adapter.config.target_modules;
    options.precision = parse_precision(batch_json.value("precision", "bf16"));
    LlamaModel model = LlamaModel::load(config, weights, options);
    model.load_adapter_tensors(adapter.tensors);
    model.place_on(Device::CUDA);
    const LossSum loss = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 0);
    nlohmann::json out = {{"loss", loss.mean()}, {"tokens", loss.tokens}};
    out["logits"] = test::values_of(model.logits(batch));
    nlohmann::json grads = nlohmann::json::object();
    for (const TrainableParameter& p : model.trainable_parameters()) {
      // PEFT names its parameters with ".default." before "weight"; the saved names have none.
      grads[p.name] = test::values_of(*p.grad);
    }
    out["grads"] = grads;
    std::ofstream(dir / ("fsdpq_" + train_type + ".json")) << out.dump();
    EXPECT_GT(loss.tokens, 0);
  }
}

}  // namespace
}  // namespace fsdpq
