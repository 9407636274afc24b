// One GPU's gradients accumulated in the training state's shard in place (ShardedParameters,
// docs/sharding.md): the same bits as zeroed tensors added there after each unit's backward
// (FSDPQ_GRADIENTS_IN_STATE=0), through the real binary: per-step losses and gradient norms, and
// the saved adapters byte for byte, with one micro-batch a step, with accumulation (the later
// micro-batches take the add), and with no_sync (the tensors accumulate every micro-batch first).
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
  std::string adapters;  // adapter_model.safetensors' bytes
};

// The fsdpq binary beside this test binary's folder (build/fsdpq for build/tests/…), where the
// GPU machine has it too; the build's path otherwise.
std::string fsdpq_binary() {
  const fs::path beside = fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "fsdpq";
  return fs::exists(beside) ? beside.string() : std::string(FSDPQ_BINARY);
}

TrainedRun train(const fs::path& dir, bool in_state, int accumulation, bool no_sync) {
  const fs::path out = dir / fmt::format("in_state{}_acc{}_nosync{}", in_state, accumulation, no_sync);
  const std::string command = fmt::format(
      "FSDPQ_GRADIENTS_IN_STATE={} '{}' --model_name preset:tiny --tokenizer_path builtin:bytes --train_type qlora "
      "--dataset dummy --dataset_samples 48 --context_length 256 --batch_size 2 --gradient_accumulation_steps {} "
      "--no_sync {} --max_steps 4 --lora_rank 8 --lora_dropout 0.1 --lr 1e-3 --use_gradient_checkpointing false "
      "--save_model true --output_dir '{}' 2>&1",
      in_state ? 1 : 0, fsdpq_binary(), accumulation, no_sync, out.string());
  const test::CommandResult r = test::run_command(command);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  TrainedRun run;
  for (const auto& s : test::of_type(test::read_jsonl(out / "metrics.jsonl"), "step")) {
    run.losses.push_back(s.at("loss").get<double>());
    run.grad_norms.push_back(s.at("grad_norm").get<double>());
  }
  std::ifstream f(out / "adapter_model.safetensors", std::ios::binary);
  run.adapters.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return run;
}

TEST(GpuFsdpGradients, InPlaceAccumulationGivesTheSameBits) {
  test::use_gpu();
  const fs::path dir = test::make_temp_dir("gradients_in_state");
  for (const auto& [accumulation, no_sync] : {std::pair{1, false}, std::pair{2, false}, std::pair{2, true}}) {
    SCOPED_TRACE(fmt::format("gradient_accumulation_steps {}, no_sync {}", accumulation, no_sync));
    const TrainedRun added = train(dir, false, accumulation, no_sync), in_place = train(dir, true, accumulation, no_sync);
    ASSERT_EQ(added.losses.size(), 4u);
    EXPECT_EQ(in_place.losses, added.losses);
    EXPECT_EQ(in_place.grad_norms, added.grad_norms);
    EXPECT_GT(added.grad_norms[0], 0.0) << "no gradient: the test would compare nothing";
    EXPECT_FALSE(added.adapters.empty());
    EXPECT_TRUE(in_place.adapters == added.adapters) << "the saved adapters differ";
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace fsdpq
