// The subcommands that prepare what a run needs on a machine with nothing downloaded:
// init-model, init-tokenizer, and demo (which uses both and then runs the embedded demo job).
#include <cerrno>
#include <cstring>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>

#include "app/arg_parser.h"
#include "app/commands.h"
#include "config/config_loader.h"
#include "data/prompts.h"
#include "data/synthetic.h"
#include "data/tokenizer.h"
#include "embedded_demo.h"
#include "model/init_model.h"
#include "model/presets.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/log.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

// Tools that write files run as one process: several ranks would write the same files.
void require_single_rank(const World& world, const std::string& command) {
  if (world.size > 1) fail("fsdpq {} writes files and runs as one process, not under mpirun/srun with {} ranks", command, world.size);
}

const std::vector<FlagSpec> kInitModelFlags = {
    {"preset", "NAME", "model shape: " + join(preset_names(), ", "), true},
    {"out", "DIR", "directory to create (config.json, safetensors, generation_config.json)", true},
    {"seed", "N", "random seed (default 0)"},
    {"tokenizer", "PATH", "a tokenizer to ship with the model: a tokenizer.model (sentencepiece or tiktoken), a "
                          "tokenizer.json (its tokenizer_config.json comes along), or a folder holding them"},
    {"tie_word_embeddings", "BOOL", "true: the LM head is the embedding (Llama-3.2 1B / 3B; no lm_head.weight); "
                                    "default: the preset's"},
    {"vocab_size", "N", "override the preset's vocabulary size (e.g. to match a small tokenizer)"},
    {"num_hidden_layers", "N", "override the preset's decoder layer count: a few layers of a real width, for "
                               "profiling a layer's kernels or a quick check"},
    {"max_shard_size", "BYTES", "split the weights into files of at most this size (default 5000000000)"},
    {"initializer_range", "STD", "standard deviation of the random weights (default: the preset's, 0.02 as HF)"},
    {"overwrite", "", "replace DIR if it exists"},
};

void init_model_from_flags(const ParsedFlags& flags, bool quiet) {
  LlamaConfig config = preset_or_fail(flags.get("preset"));
  InitModelOptions options;
  options.seed = static_cast<uint64_t>(flags.get_int("seed", 0));
  if (flags.has("tokenizer")) {
    options.tokenizer_model = flags.get("tokenizer");
    if (!fs::exists(options.tokenizer_model))
      fail("init-model: --tokenizer {}: no such file or folder", options.tokenizer_model.string());
  }
  if (flags.has("tie_word_embeddings")) {
    const std::optional<bool> tied = parse_bool(flags.get("tie_word_embeddings"));
    if (!tied) fail("init-model: --tie_word_embeddings {}: expected true or false", flags.get("tie_word_embeddings"));
    config.tie_word_embeddings = *tied;
  }
  if (flags.has("vocab_size")) {
    int64_t v = flags.get_int("vocab_size", 0);
    if (v < 3) fail("init-model: --vocab_size {}: must be at least 3", v);
    options.vocab_size = v;
  }
  if (flags.has("num_hidden_layers")) {
    const int64_t layers = flags.get_int("num_hidden_layers", 0);
    if (layers < 1 || layers > 1024) fail("init-model: --num_hidden_layers {}: must be between 1 and 1024", layers);
    config.num_hidden_layers = layers;
  }
  if (flags.has("max_shard_size")) {
    int64_t v = flags.get_int("max_shard_size", 0);
    if (v < 1024) fail("init-model: --max_shard_size {}: must be at least 1024 bytes", v);
    options.max_shard_bytes = static_cast<uint64_t>(v);
  }
  options.overwrite = flags.has("overwrite");
  if (flags.has("initializer_range")) {
    auto std_dev = parse_double(flags.get("initializer_range"));
    if (!std_dev || *std_dev <= 0 || *std_dev > 10)
      fail("init-model: --initializer_range {}: expected a number in (0, 10]", flags.get("initializer_range"));
    config.initializer_range = *std_dev;
  }
  auto start = std::chrono::steady_clock::now();
  int last_percent = -1;  // outlives the progress callback below
  if (!quiet) {
    options.progress = [&](uint64_t done, uint64_t total) {
      int percent = total ? static_cast<int>(100 * done / total) : 100;
      if (percent / 10 != last_percent / 10) {
        std::fprintf(stderr, "\rinit-model: %3d%% of %s", percent, human_bytes(static_cast<double>(total)).c_str());
        std::fflush(stderr);
        last_percent = percent;
      }
    };
  }
  init_model(config, flags.get("out"), options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!quiet) {
    std::fprintf(stderr, "\n");
    log::info("init-model: wrote {} ({}) to {} in {:.1f} s", flags.get("preset"),
              human_count(static_cast<double>(count_params(config).total)), flags.get("out"), seconds);
  }
}

const std::vector<FlagSpec> kInitTokenizerFlags = {
    {"input", "FILE", "training text: a text file, or JSON / JSONL records whose string values are used", true},
    {"out", "FILE", "the tokenizer.model to write", true},
    {"vocab_size", "N", "number of pieces (default 1024)"},
};

const std::vector<FlagSpec> kDemoFlags = {
    {"out", "DIR", "where the demo's data, tokenizer, model and run go (default runs/demo; a rerun replaces DIR/output)"},
    {"dry_run", "", "prepare and check everything, print the plan, do not train"},
};

}  // namespace

int run_init_model_command(const World& world, const std::vector<std::string>& args) {
  if (wants_help(args)) {
    log::info("{}", flags_help("fsdpq init-model --preset NAME --out DIR [flags]", kInitModelFlags));
    return kExitOk;
  }
  run_on_all_ranks(world, [&] {
    require_single_rank(world, "init-model");
    init_model_from_flags(parse_flags("init-model", kInitModelFlags, args), false);
  });
  return kExitOk;
}

int run_init_tokenizer_command(const World& world, const std::vector<std::string>& args) {
  if (wants_help(args)) {
    log::info("{}", flags_help("fsdpq init-tokenizer --input FILE --out FILE [--vocab_size N]", kInitTokenizerFlags));
    return kExitOk;
  }
  run_on_all_ranks(world, [&] {
    require_single_rank(world, "init-tokenizer");
    ParsedFlags flags = parse_flags("init-tokenizer", kInitTokenizerFlags, args);
    int64_t vocab = flags.get_int("vocab_size", 1024);
    if (vocab < 16 || vocab > 1'000'000) fail("init-tokenizer: --vocab_size {}: must be between 16 and 1000000", vocab);
    data::train_tokenizer(flags.get("input"), flags.get("out"), static_cast<int>(vocab));
    log::info("init-tokenizer: wrote {} ({} pieces)", flags.get("out"), vocab);
  });
  return kExitOk;
}

void write_text_file(const fs::path& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail("cannot write {}: {}", path.string(), std::strerror(errno));
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int write_errno = errno;
  if (std::fclose(f) != 0 || !written)
    fail("cannot write {}: {}", path.string(), std::strerror(written ? errno : write_errno));
}

// The demo's assets, made once and reused: generated records, a tokenizer trained on them, and a
// tiny model whose vocabulary matches that tokenizer.
void prepare_demo_assets(const fs::path& dir) {
  constexpr int64_t kRecords = 2000;
  constexpr int kVocab = 512;
  fs::create_directories(dir);
  fs::path data = dir / "data.jsonl", tokenizer = dir / "tokenizer.model", model = dir / "model";
  if (!fs::exists(data)) {
    data::write_jsonl(data, data::make_synthetic_records(kRecords, 1234));
    log::info("demo: generated {} records in {}", kRecords, data.string());
  }
  if (!fs::exists(tokenizer)) {
    // Train on the text the model will see (prompt template included), so that the template's
    // words become single pieces rather than runs of bytes.
    fs::path corpus = dir / "tokenizer_corpus.txt";
    std::string text;
    for (const auto& record : data::make_synthetic_records(kRecords, 1234))
      text += data::format_record(record, data::PromptStyle::Alpaca).example + "\n";
    write_text_file(corpus, text);
    data::train_tokenizer(corpus, tokenizer, kVocab);
    log::info("demo: trained a {}-piece sentencepiece tokenizer: {}", kVocab, tokenizer.string());
  }
  if (!fs::exists(model / "config.json")) {
    ParsedFlags flags;
    flags.values_ = {{"preset", "tiny"}, {"out", model.string()}, {"seed", "0"},
                     {"tokenizer", tokenizer.string()}, {"vocab_size", std::to_string(kVocab)}, {"overwrite", "true"},
                     // A tiny frozen random head at HF's 0.02 caps how far LoRA can move the
                     // logits; a wider init lets the demo show learning within a minute.
                     {"initializer_range", "0.2"}};
    init_model_from_flags(flags, true);
    log::info("demo: wrote a tiny random-initialised Llama to {}", model.string());
  }
}

int run_demo_command(const World& world, const std::vector<std::string>& args) {
  if (wants_help(args)) {
    log::info("{}", flags_help("fsdpq demo [--out DIR] [--dry_run]", kDemoFlags));
    return kExitOk;
  }
  ParsedFlags flags;
  ResolvedConfig resolved;
  run_on_all_ranks(world, [&] {
    flags = parse_flags("demo", kDemoFlags, args);
  });
  const fs::path dir = flags.get("out", "runs/demo");
  // Rank 0 makes the files; the others wait for it (and learn of its failure).
  run_on_all_ranks(world, [&] {
    if (world.is_root()) prepare_demo_assets(dir);
  });
  run_on_all_ranks(world, [&] {
    std::vector<ConfigOverride> overrides = {{"model_name", (dir / "model").string()},
                                             {"data_path", (dir / "data.jsonl").string()},
                                             {"output_dir", (dir / "output").string()},
                                             {"overwrite", "true"}};  // the demo's own folder: a rerun replaces it
    if (flags.has("dry_run")) overrides.push_back({"dry_run", "true"});
    resolved = resolve_config_text(kEmbeddedDemoIni, "inputs/demo.ini (embedded)", overrides);
  });
  for (const auto& w : resolved.warnings) log::warn("{}", w);
  return run_training_job(world, resolved);
}

}  // namespace fsdpq
