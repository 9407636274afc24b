// `fsdpq generate --model DIR [--adapter DIR] --prompt TEXT`: continues a prompt with the base
// model (bf16 or NF4, as it was trained) plus an optional PEFT LoRA adapter, on the CPU, with a KV
// cache: one prefill of [BOS] + encode(prompt) (as the training data starts), then one token per
// step, sampled as transformers' generate does, until EOS or --max_new_tokens. The continuation goes
// to stdout (streamed on a terminal); a one-line summary goes to stderr.
#include <fmt/format.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>

#include "app/arg_parser.h"
#include "app/commands.h"
#include "data/tokenizer.h"
#include "io/model_files.h"
#include "io/peft_adapter.h"
#include "model/llama_model.h"
#include "model/model_source.h"
#include "model/presets.h"
#include "model/sampling.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/log.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

const std::vector<FlagSpec> kGenerateFlags = {
    {"model", "DIR", "the base model: an HF directory, or preset:NAME (random weights, needs --tokenizer)", true},
    {"adapter", "DIR", "a PEFT LoRA adapter to apply (adapter_config.json, adapter_model.safetensors)"},
    {"prompt", "TEXT", "the text to continue (BOS is prepended, as in training)", true},
    {"max_new_tokens", "N", "stop after N new tokens (default 64)"},
    {"temperature", "T", "softmax temperature; 0 = greedy decoding (default 0.7)"},
    {"top_p", "P", "nucleus sampling: keep the smallest set of tokens with probability >= P (default 0.9)"},
    {"seed", "S", "random seed of the sampling (default 0): the same seed gives the same text"},
    {"train_type", "TYPE", "how the base is held, as in training: qlora or bnb_dora (NF4, default) or lora (bf16); "
                           "a DoRA adapter (use_dora in its config) is applied as DoRA"},
    {"precision", "P", "bf16 (default) or fp32 activations"},
    {"tokenizer", "SPEC", "a tokenizer.model, a tokenizer.json, or builtin:bytes (default: the model directory's)"},
    {"init_seed", "N", "with --model preset:NAME: the init-model --seed whose weights to use (default 0)"},
    {"logits_out", "FILE", "also write the prompt's token ids and the fp32 logits of its last position as JSON "
                           "(for tests/reference/peft_load_check.py)"},
};

struct GenerateOptions {
  std::string model;
  std::optional<fs::path> adapter;
  std::string prompt;
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;
  bool quantize_base = true;
  Precision precision = Precision::BF16;
  std::string tokenizer;
  uint64_t init_seed = 0;
  std::string logits_out;
};

double double_flag(const ParsedFlags& flags, const std::string& name, double fallback) {
  if (!flags.has(name)) return fallback;
  auto v = parse_double(flags.get(name));
  if (!v) fail("generate: --{} {}: expected a number", name, flags.get(name));
  return *v;
}

uint64_t unsigned_flag(const ParsedFlags& flags, const std::string& name) {
  const int64_t v = flags.get_int(name, 0);
  if (v < 0) fail("generate: --{} {}: must be a non-negative integer", name, v);
  return static_cast<uint64_t>(v);
}

GenerateOptions options_from_flags(const ParsedFlags& flags) {
  GenerateOptions o;
  o.model = flags.get("model");
  if (flags.has("adapter")) o.adapter = fs::path(flags.get("adapter"));
  o.prompt = flags.get("prompt");
  o.max_new_tokens = flags.get_int("max_new_tokens", 64);
  if (o.max_new_tokens < 1 || o.max_new_tokens > 1'000'000)
    fail("generate: --max_new_tokens {}: must be between 1 and 1000000", o.max_new_tokens);
  o.sampling.temperature = double_flag(flags, "temperature", 0.7);
  o.sampling.top_p = double_flag(flags, "top_p", 0.9);
  o.sampling.seed = unsigned_flag(flags, "seed");
  validate_sampling_options(o.sampling);
  const std::string train_type = flags.get("train_type", "qlora");
  if (train_type == "qlora" || train_type == "custom_qlora" || train_type == "bnb_dora")
    o.quantize_base = true;
  else if (train_type == "lora" || train_type == "custom_lora")
    o.quantize_base = false;
  else
    fail("generate: --train_type {}: must be qlora or bnb_dora (NF4 base) or lora (bf16 base)", train_type);
  const std::string precision = flags.get("precision", "bf16");
  if (precision == "bf16")
    o.precision = Precision::BF16;
  else if (precision == "fp32")
    o.precision = Precision::FP32;
  else
    fail("generate: --precision {}: must be bf16 or fp32", precision);
  o.tokenizer = flags.get("tokenizer");
  if (flags.has("init_seed") && !starts_with(o.model, "preset:"))
    fail("generate: --init_seed only applies to --model preset:NAME (a model directory has its weights)");
  o.init_seed = unsigned_flag(flags, "init_seed");
  o.logits_out = flags.get("logits_out");
  return o;
}

// Prints the continuation as it grows on a terminal; elsewhere (pipes, files, tests) once at the
// end, so the output is exactly the decoded text even where a tokenizer's decode is not
// prefix-stable.
class TextStream {
 public:
  explicit TextStream(const data::Tokenizer& tokenizer) : tokenizer_(tokenizer), live_(::isatty(STDOUT_FILENO)) {}

  void update(const std::vector<int32_t>& ids) {
    if (!live_) return;
    const std::string text = tokenizer_.decode(ids);
    // Hold back until the text extends what is shown and ends on a whole UTF-8 character.
    if (text.size() <= printed_.size() || text.compare(0, printed_.size(), printed_) != 0 || !is_valid_utf8(text))
      return;
    std::fputs(text.c_str() + printed_.size(), stdout);
    std::fflush(stdout);
    printed_ = text;
  }

  void finish(const std::vector<int32_t>& ids) {
    const std::string text = tokenizer_.decode(ids);
    if (!live_ || text.compare(0, printed_.size(), printed_) != 0) {
      if (live_) std::fputs("\n", stdout);  // streamed text disagreed with the final decode: start afresh
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      std::fwrite(text.data() + printed_.size(), 1, text.size() - printed_.size(), stdout);
    }
    std::fputs("\n", stdout);
    std::fflush(stdout);
  }

 private:
  const data::Tokenizer& tokenizer_;
  bool live_;
  std::string printed_;
};

void generate(const GenerateOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  ModelOptions model_options;
  model_options.quantize_base = o.quantize_base;
  model_options.train_base = false;
  model_options.lora_dropout = 0;
  model_options.precision = o.precision;
  model_options.lora_targets.clear();
  // The model and its tokenizer.
  const ModelSource source = open_model_source(o.model);
  std::string tokenizer_spec = o.tokenizer;
  if (tokenizer_spec.empty()) {
    if (source.is_preset())
      fail("generate: --model {} has no tokenizer: pass --tokenizer PATH (a tokenizer.model, a tokenizer.json, or "
           "builtin:bytes)", o.model);
    if (!data::folder_has_tokenizer(source.directory))
      fail("generate: model directory '{}' has no tokenizer.model or tokenizer.json: pass --tokenizer PATH (a "
           "tokenizer.model, a tokenizer.json, or builtin:bytes)", o.model);
    tokenizer_spec = source.directory.string();
  }
  const std::unique_ptr<data::Tokenizer> tokenizer = data::load_tokenizer(tokenizer_spec);
  const LlamaConfig& config = source.config;
  if (tokenizer->vocab_size() > config.vocab_size)
    fail("generate: the tokenizer ({}) has {} tokens but the model's vocab_size is {}: its ids would fall outside "
         "the embedding", tokenizer->description(), tokenizer->vocab_size(), config.vocab_size);

  std::vector<int32_t> prompt_ids = {tokenizer->bos_id()};
  for (int32_t id : tokenizer->encode(o.prompt)) prompt_ids.push_back(id);
  const int64_t prompt_tokens = static_cast<int64_t>(prompt_ids.size());
  const int64_t max_positions = config.max_position_embeddings;
  if (prompt_tokens > max_positions)
    fail("generate: the prompt is {} tokens (BOS included), longer than the model's max_position_embeddings ({})",
         prompt_tokens, max_positions);
  // A new token needs the logits of the position before it; it is fed back only if another follows.
  const int64_t room = max_positions - prompt_tokens + 1;
  const int64_t limit = std::min(o.max_new_tokens, room);

  std::optional<LoadedAdapter> adapter;
  if (o.adapter) {
    adapter = load_peft_adapter(*o.adapter);
    model_options.lora_targets = adapter->config.target_modules;
    model_options.lora_rank = adapter->config.r;
    model_options.lora_alpha = adapter->config.lora_alpha;
    model_options.use_dora = adapter->config.use_dora;  // a DoRA adapter makes its linears DoRA linears
  }
  LlamaModel model = source.is_preset() ? LlamaModel::random(config, o.init_seed, model_options)
                                        : LlamaModel::load(config, ModelWeights::open(source.directory), model_options);
  if (adapter) model.load_adapter_tensors(adapter->tensors);
  adapter.reset();  // the model holds its own copy

  std::vector<int32_t> eos = {tokenizer->eos_id()};
  for (int64_t id : config.eos_token_ids) eos.push_back(static_cast<int32_t>(id));
  const auto loaded = std::chrono::steady_clock::now();

  KvCache cache = model.make_cache(prompt_tokens + limit - 1);
  std::vector<float> logits = model.forward_cached(prompt_ids, cache);
  if (!o.logits_out.empty()) {
    const nlohmann::json dump = {{"model", o.model},
                                 {"adapter", o.adapter ? o.adapter->string() : ""},
                                 {"train_type", o.quantize_base ? "qlora" : "lora"},
                                 {"precision", o.precision == Precision::FP32 ? "fp32" : "bf16"},
                                 {"input_ids", prompt_ids},
                                 {"last_logits", logits}};
    write_file_atomically(o.logits_out, dump.dump() + "\n");
  }
  std::vector<int32_t> generated;
  TextStream stream(*tokenizer);
  std::string stopped = "max_new_tokens";
  for (int64_t step = 0; step < limit; ++step) {
    const int32_t token = sample_token(logits, o.sampling, static_cast<uint64_t>(step));
    if (std::find(eos.begin(), eos.end(), token) != eos.end()) {
      stopped = "EOS";
      break;
    }
    generated.push_back(token);
    stream.update(generated);
    if (step + 1 < limit) logits = model.forward_cached({token}, cache);
  }
  if (stopped != "EOS" && limit < o.max_new_tokens) stopped = "max_position_embeddings";
  stream.finish(generated);

  const auto end = std::chrono::steady_clock::now();
  const double load_s = std::chrono::duration<double>(loaded - start).count();
  const double gen_s = std::chrono::duration<double>(end - loaded).count();
  std::fprintf(stderr, "generate: %lld prompt tokens + %lld new tokens (stopped at %s); loaded in %.1f s, generated in %.1f s\n",
               static_cast<long long>(prompt_tokens), static_cast<long long>(generated.size()), stopped.c_str(), load_s,
               gen_s);
}

}  // namespace

int run_generate_command(const World& world, const std::vector<std::string>& args) {
  if (wants_help(args)) {
    log::info("{}", flags_help("fsdpq generate --model DIR [--adapter DIR] --prompt TEXT [flags]", kGenerateFlags));
    return kExitOk;
  }
  run_on_all_ranks(world, [&] {
    if (world.size > 1) fail("fsdpq generate runs as one process, not under mpirun/srun with {} ranks", world.size);
    generate(options_from_flags(parse_flags("generate", kGenerateFlags, args)));
  });
  return kExitOk;
}

}  // namespace fsdpq
