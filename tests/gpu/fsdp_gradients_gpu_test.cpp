// One GPU's fast paths between the model and the training state (ShardedParameters,
// docs/sharding.md), each against its plain form through the real binary: per-step losses and
// gradient norms, and the saved adapters byte for byte.
//  - gradients accumulated in the state's shard in place, against zeroed tensors added there after
//    each unit's backward (FSDPQ_GRADIENTS_IN_STATE=0): with one micro-batch a step, with
//    accumulation (the later micro-batches take the add), and with no_sync (the tensors accumulate
//    every micro-batch first);
//  - compute copies written by the optimizer's pass into one buffer a unit, against a conversion
//    per tensor after it (FSDPQ_FUSED_COMPUTE_COPIES=0), for LoRA and full fine-tuning (whose root
//    unit, embedding and head, trains too), and across a resume (the loaded masters' refresh).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpu/op_parity.h"
#include "metrics_records.h"
#include "test_support.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;

struct TrainedRun {
  std::vector<double> losses, grad_norms;
  std::string adapters;  // the saved adapters' (or full fine-tuning's model's) bytes
};

// The fsdpq binary beside this test binary's folder (build/fsdpq for build/tests/…), where the
// GPU machine has it too; the build's path otherwise.
std::string fsdpq_binary() {
  const fs::path beside = fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "fsdpq";
  return fs::exists(beside) ? beside.string() : std::string(FSDPQ_BINARY);
}

// `environment`: VAR=value settings before the command; `flags`: more fsdpq flags.
TrainedRun train(const fs::path& out, const std::string& environment, const std::string& flags) {
  const std::string command = fmt::format(
      "{} '{}' --model_name preset:tiny --tokenizer_path builtin:bytes --dataset dummy --dataset_samples 48 "
      "--context_length 256 --batch_size 2 --lora_rank 8 --lora_dropout 0.1 --lr 1e-3 "
      "--use_gradient_checkpointing false --save_model true --output_dir '{}' {} 2>&1",
      environment, fsdpq_binary(), out.string(), flags);
  const test::CommandResult r = test::run_command(command);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  TrainedRun run;
  for (const auto& s : test::of_type(test::read_jsonl(out / "metrics.jsonl"), "step")) {
    run.losses.push_back(s.at("loss").get<double>());
    run.grad_norms.push_back(s.at("grad_norm").get<double>());
  }
  // LoRA saves its adapters, full fine-tuning the model.
  const fs::path saved = fs::exists(out / "adapter_model.safetensors") ? out / "adapter_model.safetensors"
                                                                        : out / "model.safetensors";
  std::ifstream f(saved, std::ios::binary);
  run.adapters.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return run;
}

TEST(GpuFsdpGradients, InPlaceAccumulationGivesTheSameBits) {
  test::use_gpu();
  const fs::path dir = test::make_temp_dir("gradients_in_state");
  for (const auto& [accumulation, no_sync] : {std::pair{1, false}, std::pair{2, false}, std::pair{2, true}}) {
    SCOPED_TRACE(fmt::format("gradient_accumulation_steps {}, no_sync {}", accumulation, no_sync));
    const std::string flags = fmt::format("--train_type qlora --max_steps 4 --gradient_accumulation_steps {} --no_sync {}",
                                          accumulation, no_sync);
    const std::string name = fmt::format("acc{}_nosync{}", accumulation, no_sync);
    const TrainedRun added = train(dir / ("added_" + name), "FSDPQ_GRADIENTS_IN_STATE=0", flags);
    const TrainedRun in_place = train(dir / ("in_place_" + name), "FSDPQ_GRADIENTS_IN_STATE=1", flags);
    ASSERT_EQ(added.losses.size(), 4u);
    EXPECT_EQ(in_place.losses, added.losses);
    EXPECT_EQ(in_place.grad_norms, added.grad_norms);
    EXPECT_GT(added.grad_norms[0], 0.0) << "no gradient: the test would compare nothing";
    EXPECT_FALSE(added.adapters.empty());
    EXPECT_TRUE(in_place.adapters == added.adapters) << "the saved adapters differ";
  }
  fs::remove_all(dir);
}

TEST(GpuFsdpGradients, ComputeCopiesWrittenByTheOptimizerGiveTheSameBits) {
  test::use_gpu();
  const fs::path dir = test::make_temp_dir("fused_compute_copies");
  for (const char* train_type : {"qlora", "full"}) {
    SCOPED_TRACE(train_type);
    // 3 steps with a checkpoint after each, then the run resumed from step 2 to 4: the loaded
    // masters' compute copies are refreshed without an update.
    auto run = [&](const std::string& name, const char* fused) {
      const std::string environment = fmt::format("FSDPQ_FUSED_COMPUTE_COPIES={}", fused);
      const std::string flags = fmt::format("--train_type {} --save_every_steps 1", train_type);
      const fs::path out = dir / fmt::format("{}_{}", train_type, name);
      train(out, environment, flags + " --max_steps 3");
      return train(out, environment, flags + " --max_steps 5 --resume auto");
    };
    const TrainedRun per_tensor = run("per_tensor", "0"), fused = run("fused", "1");
    ASSERT_FALSE(per_tensor.losses.empty());
    EXPECT_EQ(fused.losses, per_tensor.losses);
    EXPECT_EQ(fused.grad_norms, per_tensor.grad_norms);
    EXPECT_FALSE(per_tensor.adapters.empty());
    EXPECT_TRUE(fused.adapters == per_tensor.adapters) << "the saved adapters differ";
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fsdpq
