// `fsdpq examples CONFIG.ini [--key value ...] --out FILE`: the train examples exactly as a run
// builds them (dataset, prompt style, tokenizer, labels masked, cut to context_length), one
// {"input_ids": [...], "labels": [...]} line each, in the order a one-rank run's sampler visits
// them in epoch 1. So a peer (bench/peer_train.py --examples) trains on the same examples in the
// same order as fsdpq, without reimplementing prompts or tokenization (docs/packing.md).
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/run_plan.h"
#include "data/sampler.h"
#include "io/model_files.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/log.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;

const char* kExamplesHelp = R"(usage: fsdpq examples [CONFIG.ini] [--key value ...] --out FILE

Writes the train examples as training builds them — the dataset, its prompt style, the tokenizer,
labels -100 on the prompt, cut to context_length, the train split cut to whole batches — one JSON
line each: {"input_ids": [...], "labels": [...]}, in the order epoch 1 of a one-rank run visits
them (the sampler's shuffle for the config's seed). The file is written whole or not at all.

flags:
  --out FILE       where to write the examples (required)
Every config setting may follow as --key value, as for training (e.g. --context_length 512).
)";

struct ExamplesFlags {
  std::string out;
  std::vector<std::string> rest;  // the config file and its overrides
};

ExamplesFlags parse_examples_flags(const std::vector<std::string>& args) {
  ExamplesFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--out") {
      if (i + 1 >= args.size() || starts_with(args[i + 1], "--")) fail("examples: --out needs a file name");
      f.out = args[++i];
    } else if (starts_with(args[i], "--out=")) {
      f.out = args[i].substr(6);
    } else {
      f.rest.push_back(args[i]);
    }
  }
  if (f.out.empty()) fail("examples: --out FILE is required (where to write the examples)");
  return f;
}

// Before the slow part: a path that cannot become a file is refused with its name.
void check_writable_file_path(const fs::path& out) {
  std::error_code ec;
  if (fs::is_directory(out, ec)) fail("examples: --out {} is a folder; expected a file name", out.string());
  const fs::path folder = out.parent_path().empty() ? fs::path(".") : out.parent_path();
  if (!fs::is_directory(folder, ec))
    fail("examples: --out {}: the folder {} does not exist", out.string(), folder.string());
}

// One line per example, in `order`.
std::string examples_jsonl(const data::ExampleSet& examples, const std::vector<int64_t>& order) {
  std::string text;
  for (int64_t index : order) {
    const data::Example& e = examples[static_cast<size_t>(index)];
    const nlohmann::ordered_json line = {{"input_ids", e.input_ids}, {"labels", e.labels}};
    text += line.dump() + "\n";
  }
  return text;
}

}  // namespace

int run_examples_command(const World& world, const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      log::info("{}", kExamplesHelp);
      return kExitOk;
    }
  ExamplesFlags flags;
  run_on_all_ranks(world, [&] {
    if (world.size > 1) fail("fsdpq examples runs as one process, not under mpirun/srun with {} ranks", world.size);
    flags = parse_examples_flags(args);
    check_writable_file_path(flags.out);
  });
  const ResolvedConfig resolved = resolve_train_arguments(world, flags.rest);
  const RunPlan plan = prepare_run(world, resolved, DataUse::Export);
  run_on_all_ranks(world, [&] {
    const data::ExampleSet& train = plan.dataset.train;
    // What rank 0 of a one-rank run reads in epoch 1 (the trainer's sampler, epoch index 0).
    const data::DistributedSampler sampler(static_cast<int64_t>(train.size()), 1, 0,
                                           static_cast<uint64_t>(resolved.config.seed));
    const std::vector<int64_t> order = sampler.indices(0);
    try {
      write_file_atomically(flags.out, examples_jsonl(train, order));
    } catch (const UserError& e) {
      fail("examples: cannot write --out {}: {}", flags.out, e.what());
    }
    int64_t tokens = 0;
    for (int64_t index : order) tokens += static_cast<int64_t>(train[static_cast<size_t>(index)].input_ids.size());
    log::info("examples: wrote {} train examples ({} tokens, context_length {}) in epoch 1's order for seed {} to {}",
              order.size(), tokens, resolved.config.context_length, resolved.config.seed, flags.out);
  });
  return kExitOk;
}

}  // namespace fsdpq
