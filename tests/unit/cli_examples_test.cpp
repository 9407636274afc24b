// `fsdpq examples` through the real binary: the exported examples are the ones training collates,
// in its order — checked against the first batches EpochBatches hands a one-rank run — and bad
// arguments are refused with the flag, key or file named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "app/commands.h"
#include "app/run_plan.h"
#include "data/sampler.h"
#include "test_support.h"
#include "train/epoch_batches.h"

namespace fsdpq {
namespace {
namespace fs = std::filesystem;
using test::run_fsdpq;

struct Exported {
  std::vector<int32_t> input_ids, labels;
};

std::vector<Exported> read_examples(const fs::path& file) {
  std::vector<Exported> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j.size(), 2u) << line;
    out.push_back({j.at("input_ids").get<std::vector<int32_t>>(), j.at("labels").get<std::vector<int32_t>>()});
  }
  return out;
}

std::vector<std::string> words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// Exports with `settings`, then builds the same run in this process and checks the file against the
// first `batches` micro-batches of epoch 1 as the trainer builds them (its sampler, BatchShape and
// collate): row r of batch b is line b·batch_size + r, padded with the tokenizer's pad id and -100
// to the batch's longest line. `exported`: the file's examples.
void export_and_check_against_training(const std::string& settings, int64_t batches, std::vector<Exported>& exported) {
  const fs::path dir = test::make_temp_dir("cli-examples");
  const fs::path file = dir / "examples.jsonl";
  const auto r = run_fsdpq("examples " + settings + " --out '" + file.string() + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  exported = read_examples(file);

  const World world;  // one rank, as the export
  const ResolvedConfig resolved = resolve_train_arguments(world, words(settings));
  const RunPlan plan = prepare_run(world, resolved);
  const TrainConfig& c = resolved.config;
  EXPECT_EQ(exported.size(), plan.dataset.train.size()) << "every train example once";
  const data::DistributedSampler sampler(static_cast<int64_t>(plan.dataset.train.size()), world.size, world.rank,
                                         static_cast<uint64_t>(c.seed));
  const BatchShape shape{.batch_size = c.batch_size,
                         .pad_id = plan.tokenizer->pad_id(),
                         .context_length = c.context_length,
                         .pad_to_context_length = c.pad_to_context_length,
                         .packing = c.packing};
  const EpochBatches epoch(plan.dataset.train, sampler, 0, shape);
  for (int64_t b = 0; b < batches; ++b) {
    const data::Batch batch = epoch.batch(b);
    ASSERT_EQ(batch.batch_size, c.batch_size);
    size_t longest = 0;
    for (int64_t row = 0; row < batch.batch_size; ++row) {
      const Exported& e = exported.at(static_cast<size_t>(b * c.batch_size + row));
      ASSERT_EQ(e.labels.size(), e.input_ids.size());
      ASSERT_LE(static_cast<int64_t>(e.input_ids.size()), c.context_length);
      longest = std::max(longest, e.input_ids.size());
      for (int64_t k = 0; k < batch.seq_len; ++k) {
        const size_t at = static_cast<size_t>(row * batch.seq_len + k);
        const bool real = static_cast<size_t>(k) < e.input_ids.size();
        EXPECT_EQ(batch.input_ids[at], real ? e.input_ids[static_cast<size_t>(k)] : plan.tokenizer->pad_id())
            << "batch " << b << " row " << row << " position " << k;
        EXPECT_EQ(batch.labels[at], real ? e.labels[static_cast<size_t>(k)] : -100)
            << "batch " << b << " row " << row << " position " << k;
      }
    }
    EXPECT_EQ(batch.seq_len, static_cast<int64_t>(longest)) << "padded to the batch's longest example";
  }
}

TEST(CliExamples, HelpAndUsage) {
  auto r = run_fsdpq("examples --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("usage: fsdpq examples [CONFIG.ini] [--key value ...] --out FILE"), std::string::npos)
      << r.output;
  r = run_fsdpq("--help");
  EXPECT_NE(r.output.find("fsdpq examples CONFIG.ini --out FILE"), std::string::npos) << r.output;
}

// The demo's synthetic records with the byte tokenizer: lengths vary, the prompt is masked, and at
// context 240 some examples are cut.
TEST(CliExamples, TheFirstBatchesAreTrainingsBatches) {
  std::vector<Exported> exported;
  export_and_check_against_training(
      "--model_name preset:tiny --tokenizer_path builtin:bytes --dataset synthetic --dataset_samples 24 "
      "--batch_size 4 --context_length 240 --seed 7",
      3, exported);
  if (HasFatalFailure()) return;
  ASSERT_EQ(exported.size(), 24u);
  size_t cut = 0, masked = 0;
  for (const Exported& e : exported) {
    cut += e.input_ids.size() == 240;
    masked += e.labels.front() == -100;
  }
  EXPECT_GT(cut, 0u) << "some examples must reach context_length for the test to check truncation";
  EXPECT_EQ(masked, exported.size()) << "the prompt (BOS first) is never a target";
}

// inputs/sql.ini's data with Llama-2's tokenizer, as scripts/device_packing.sh exports it.
TEST(CliExamples, SqlWithLlamaTokenizerMatchesTraining) {
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(tokenizer, "tokenizer.model");
  std::vector<Exported> exported;
  export_and_check_against_training(
      std::string(FSDPQ_SOURCE_DIR) + "/inputs/sql.ini --model_name preset:tiny --tokenizer_path " +
          tokenizer.string() + " --data_path " + sql.string() + " --context_length 512 --seed 42",
      2, exported);
  if (HasFatalFailure()) return;
  ASSERT_EQ(exported.size(), 4000u);
  int64_t tokens = 0;
  for (const Exported& e : exported) tokens += static_cast<int64_t>(e.input_ids.size());
  EXPECT_EQ(tokens, 368175) << "docs/packing.md's count of sql's tokens at context 512";
}

TEST(CliExamples, ErrorsNameTheFlagKeyOrFile) {
  const fs::path dir = test::make_temp_dir("cli-examples-errors");
  const std::string run = "examples --model_name preset:tiny --tokenizer_path builtin:bytes --dataset synthetic "
                          "--dataset_samples 8";
  struct Case {
    std::string args, error;
  } cases[] = {
      {run, "fsdpq: error: examples: --out FILE is required (where to write the examples)"},
      {run + " --out", "fsdpq: error: examples: --out needs a file name"},
      {run + " --out '" + (dir / "missing" / "x.jsonl").string() + "'",
       "fsdpq: error: examples: --out " + (dir / "missing" / "x.jsonl").string() + ": the folder " +
           (dir / "missing").string() + " does not exist"},
      {run + " --out '" + dir.string() + "'",
       "fsdpq: error: examples: --out " + dir.string() + " is a folder; expected a file name"},
      {run + " --batch_sise 2 --out '" + (dir / "x.jsonl").string() + "'",
       "fsdpq: error: command line: '--batch_sise' is not a known setting (did you mean '--batch_size'?)"},
      {"examples --model_name preset:tiny --tokenizer_path builtin:bytes --dataset sql --data_path '" +
           (dir / "none.jsonl").string() + "' --out '" + (dir / "x.jsonl").string() + "'",
       "fsdpq: error: data_path"},
  };
  for (const Case& c : cases) {
    const auto r = run_fsdpq(c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.error), std::string::npos) << c.args << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(dir / "x.jsonl")) << "nothing is written when the run's settings fail";
}

// The file is replaced whole: a second export over the first leaves no temporary behind.
TEST(CliExamples, WritesTheFileAtomically) {
  const fs::path dir = test::make_temp_dir("cli-examples-atomic");
  const std::string run = "examples --model_name preset:tiny --tokenizer_path builtin:bytes --dataset synthetic "
                          "--dataset_samples 8 --out '" + (dir / "x.jsonl").string() + "'";
  test::write_file(dir / "x.jsonl", "an older file\n");
  auto r = run_fsdpq(run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(read_examples(dir / "x.jsonl").size(), 8u);
  EXPECT_FALSE(fs::exists(dir / "x.jsonl.tmp"));
}

}  // namespace
}  // namespace fsdpq
