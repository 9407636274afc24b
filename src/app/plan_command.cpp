// `fsdpq plan CONFIG.ini [--gpus N] [--gpu-mem GiB] [--host-mem GiB] [--max-batch N] [--key value ...]`:
// the memory planner (docs/planner.md). Predicts per-GPU and per-host memory of the config from
// the model's shape, then walks fsdp_qlora's practical guide and recommends the first setting
// that fits with the largest batch size. Reads only the model's config (no weights, no data).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "app/arg_parser.h"
#include "app/commands.h"
#include "config/train_config.h"
#include "plan/memory_plan.h"
#include "model/model_source.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/log.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

const char* kPlanHelp = R"(usage: fsdpq plan [CONFIG.ini] [flags] [--key value ...]

Predicts per-GPU and per-host peak memory of a training config from the model's shape and walks
fsdp_qlora's practical guide (DDP → + gradient checkpointing → shard_grad_op → full_shard → CPU
offload → activation offload), recommending the first setting that fits with the largest batch.

flags:
  --gpus N          GPUs (= ranks) of the run (default: the config's world_size, else 1)
  --gpu-mem GiB     memory of one GPU (default 80)
  --host-mem GiB    host memory of one node; without it host memory is shown but not checked
  --max-batch N     largest batch size tried: 1, 2, 4 … N (default 64)
Any config setting may follow as --key value (e.g. --context_length 2048).
)";

struct PlanFlags {
  int gpus = 0;  // 0: from the config
  double gpu_mem_gib = 80;
  double host_mem_gib = 0;
  int64_t max_batch = 64;
  std::vector<std::string> rest;  // the config file and its overrides
};

double positive_number(const std::string& flag, const std::string& value, double max) {
  const auto v = parse_double(value);
  if (!v || !std::isfinite(*v) || *v <= 0 || *v > max)
    fail("plan: --{} '{}': expected a number of GiB above 0 and at most {}", flag, value, max);
  return *v;
}

int64_t integer_in(const std::string& flag, const std::string& value, int64_t lo, int64_t hi) {
  const auto v = parse_int(value);
  if (!v || *v < lo || *v > hi) fail("plan: --{} '{}': expected an integer from {} to {}", flag, value, lo, hi);
  return *v;
}

PlanFlags parse_plan_flags(const std::vector<std::string>& args) {
  static const std::vector<std::string> names = {"gpus", "gpu-mem", "host-mem", "max-batch"};
  PlanFlags f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!starts_with(arg, "--")) {
      f.rest.push_back(arg);
      continue;
    }
    auto [name, value, has_value] = split_flag_word(arg);
    std::string flag = name;
    for (char& ch : flag)
      if (ch == '_') ch = '-';
    if (std::find(names.begin(), names.end(), flag) == names.end()) {
      f.rest.push_back(arg);  // a config setting (checked, with suggestions, by the config loader)
      continue;
    }
    if (!has_value) {
      if (i + 1 >= args.size() || starts_with(args[i + 1], "--")) fail("plan: --{} needs a value", flag);
      value = args[++i];
    }
    if (flag == "gpus") f.gpus = static_cast<int>(integer_in(flag, value, 1, 1 << 20));
    if (flag == "gpu-mem") f.gpu_mem_gib = positive_number(flag, value, 1 << 20);
    if (flag == "host-mem") f.host_mem_gib = positive_number(flag, value, 1 << 24);
    if (flag == "max-batch") f.max_batch = integer_in(flag, value, 1, 65536);
  }
  return f;
}

std::string gib(int64_t bytes) { return fmt::format("{:.2f}", static_cast<double>(bytes) / kGiB); }

// Which layers checkpointing recomputes: "" for every layer, else which (checkpoint_every) and
// which not (keep_activation_layers).
std::string recomputed_text(const PlanSetting& s) {
  std::string text = s.checkpoint_every == 1 ? "" : fmt::format(" every {}th layer", s.checkpoint_every);
  if (s.keep_activation_layers > 0) text += fmt::format(" (the last {} not recomputed)", s.keep_activation_layers);
  return text;
}

std::string checkpointing_text(const PlanSetting& s) {
  if (!s.gradient_checkpointing) return "off";
  return "on" + recomputed_text(s);
}

std::string kept_dense_text(const PlanSetting& s) {
  return s.keep_dequantized_layers > 0 ? fmt::format(" + {} layers kept dense", s.keep_dequantized_layers) : "";
}

std::string setting_text(const PlanSetting& s) {
  return fmt::format("{}, checkpointing {}{}, cpu offload {}, activation offload {}, batch {}{}",
                     sharding_strategy_name(s.strategy), checkpointing_text(s),
                     s.recompute_elementwise ? " + elementwise recompute" : "", s.cpu_offload ? "on" : "off",
                     s.activation_offload ? "on" : "off", s.batch_size, kept_dense_text(s));
}

std::string setting_flags(const PlanSetting& s) {
  return fmt::format("--sharding_strategy {} --use_gradient_checkpointing {} --checkpoint_every {} "
                     "--keep_activation_layers {} --recompute_elementwise {} --use_cpu_offload {} "
                     "--use_activation_cpu_offload {} --batch_size {} --keep_dequantized_layers {}",
                     sharding_strategy_name(s.strategy), s.gradient_checkpointing,
                     s.gradient_checkpointing ? s.checkpoint_every : 1,
                     s.gradient_checkpointing ? s.keep_activation_layers : 0, s.recompute_elementwise, s.cpu_offload,
                     s.activation_offload, s.batch_size, s.keep_dequantized_layers);
}

// What the batch counts, and when packing pays (docs/packing.md). The prediction is for batch ×
// context_length tokens either way: an unpacked run reaches it only on steps whose longest example
// is context_length long; a packed one on nearly every step, since its rows are nearly full.
std::string packing_note(const TrainConfig& c) {
  if (c.packing)
    return fmt::format(
        "\nPacking is on: the batch counts rows of up to {} tokens, each holding several examples. Rows come out "
        "~95-99% full, so the prediction above (every row context_length long) is what most steps reach, and the "
        "recommended batch of rows carries about batch × {} real tokens per micro-batch.\n",
        c.context_length, c.context_length);
  if (c.padding_free)
    return fmt::format(
        "\npadding_free is on: each micro-batch's examples are laid end to end in one row of their total length "
        "(at most batch × {} tokens, what the prediction above counts), so none of the padding that rows padded to "
        "the batch's longest example would hold is computed; the dry run counts it. packing = true goes further where "
        "records are much shorter than {} tokens: rows filled with several examples, the batch counting rows "
        "(docs/packing.md).\n",
        c.context_length, c.context_length);
  return fmt::format(
      "\nThe batch counts examples, each predicted at context_length ({}) tokens; with examples padded to the "
      "batch's longest, typical steps are smaller. When most records are much shorter than {} tokens (the dry run "
      "prints their p50/p90), packing = true pays: rows are filled with several examples to ~{} tokens, so the "
      "same memory per row does context_length / p50 times the work and padding all but disappears. Then the "
      "batch above counts rows, and fewer of them carry the tokens of this many examples. padding_free = true keeps "
      "fsdp_qlora's batches of examples and computes none of their padding either (docs/packing.md).\n",
      c.context_length, c.context_length, c.context_length);
}

// The recommended setting recomputes layers without use_activation_cpu_offload: what the offload
// would free on the GPU and cost on the host. The guide does not choose it (fsdp_qlora's ladder
// puts it last, and whether its copies hide depends on the host link), so the numbers are shown.
std::string activation_offload_note(PlanInput input, const GuideStep& recommended, double host_mem_gib) {
  if (!recommended.setting.gradient_checkpointing || recommended.setting.activation_offload) return "";
  input.setting = recommended.setting;
  input.setting.activation_offload = true;
  const MemoryPrediction offloaded = predict_memory(input);
  const int64_t freed = recommended.prediction.gpu_peak - offloaded.gpu_peak;
  if (freed <= 0) return "";
  const bool host_short = host_mem_gib > 0 && offloaded.host_per_node > static_cast<int64_t>(host_mem_gib * kGiB);
  return fmt::format(
      "  With use_activation_cpu_offload = true this setting would free {} GiB per GPU for {} GiB more pinned host "
      "memory per node{}, and its recompute skips attention and o_proj: spent on layers not recomputed "
      "(keep_activation_layers), it trained 5% faster at the same GPU memory on an H100 (7B, context 2048, "
      "batch 8; bench/RESULTS.md). Plan with it: add --use_activation_cpu_offload true.\n",
      gib(freed), gib(offloaded.host_per_node - recommended.prediction.host_per_node),
      host_short ? fmt::format(" ({} GiB in all: more than the {} GiB given)", gib(offloaded.host_per_node), host_mem_gib)
                 : "");
}

std::string format_plan(const TrainConfig& c, const PlanInput& input, const PlanFlags& flags, const GuideResult& guide) {
  const MemoryPrediction m = predict_memory(input);
  std::string out;
  out += fmt::format("fsdpq plan: {} ({} layers, hidden {}, vocab {}), {}{}, {}, {}, context {}\n", c.model_name,
                     input.model.num_hidden_layers, input.model.hidden_size, input.model.vocab_size, c.train_type,
                     c.is_lora()     ? fmt::format(" r {} on {}", c.lora_rank, join(c.lora_target_modules, ","))
                     : c.llama_pro() ? fmt::format(" ({} of the layers new blocks)", input.new_blocks)
                                     : "",
                     c.precision, c.optimizer, c.context_length);
  out += fmt::format("{} GPU{} of {} GiB, {} rank{} per node, host memory {}\n\n", input.world_size,
                     input.world_size == 1 ? "" : "s", flags.gpu_mem_gib, m.ranks_per_node,
                     m.ranks_per_node == 1 ? "" : "s",
                     flags.host_mem_gib > 0 ? fmt::format("{} GiB per node", flags.host_mem_gib)
                                            : std::string("not checked (--host-mem GiB)"));
  out += fmt::format("This config ({}; units sharded over {} rank{}):\n\n", setting_text(input.setting), m.shard_size,
                     m.shard_size == 1 ? "" : "s");
  out += "| memory | per GPU GiB | host GiB per rank |\n|---|---:|---:|\n";
  for (const MemoryItem& item : m.items)
    out += fmt::format("| {} | {} | {} |\n", item.what, item.gpu ? gib(item.gpu) : "", item.host ? gib(item.host) : "");
  out += fmt::format("| process (binary, libraries, MPI, CUDA host side) |  | {} |\n", gib(kHostProcessBytes));
  out += fmt::format("| **after load (allocated)** | {} |  |\n", gib(m.gpu_after_load));
  out += fmt::format("| **peak allocated** | {} |  |\n", gib(m.gpu_peak));
  out += fmt::format("| **needed per GPU** (+{:.0f}% allocator cache, +{} GiB CUDA context) | {} |  |\n",
                     kAllocatorSlack * 100, gib(kCudaContextBytes), gib(m.gpu_required));
  out += fmt::format("| **host peak per rank / per node** |  | {} / {} |\n\n", gib(m.host_per_rank), gib(m.host_per_node));

  out += fmt::format("Practical guide (fsdp_qlora's benchmark report): the largest batch of 1, 2, 4 … {} that fits; "
                     "with checkpointing, then the fewest recomputed layers that still fit (checkpoint_every), "
                     "each first with the kept layers whole, then trimmed (recompute_elementwise), else the last "
                     "layers' activations kept in the memory left (keep_activation_layers), trimmed where that "
                     "keeps more; on a quantised base, then as many of the last layers kept dense as still fit "
                     "(keep_dequantized_layers)\n\n",
                     flags.max_batch);
  out += "| # | step | setting | batch | GPU GiB needed | host GiB per node | fits |\n|---|---|---|---:|---:|---:|---|\n";
  for (size_t i = 0; i < guide.steps.size(); ++i) {
    const GuideStep& g = guide.steps[i];
    const bool gpu_ok = g.prediction.gpu_required <= static_cast<int64_t>(flags.gpu_mem_gib * kGiB);
    const bool host_ok = flags.host_mem_gib <= 0 || g.prediction.host_per_node <= static_cast<int64_t>(flags.host_mem_gib * kGiB);
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", i + 1, g.name,
                       fmt::format("{}{}{}{}{}{}", sharding_strategy_name(g.setting.strategy),
                                   g.setting.gradient_checkpointing ? " + ckpt" + recomputed_text(g.setting) : "",
                                   g.setting.recompute_elementwise ? " + elementwise recompute" : "",
                                   g.setting.cpu_offload ? " + cpu offload" : "",
                                   g.setting.activation_offload ? " + act offload" : "", kept_dense_text(g.setting)),
                       g.fits ? std::to_string(g.setting.batch_size) : "-", gib(g.prediction.gpu_required),
                       gib(g.prediction.host_per_node),
                       g.fits ? (static_cast<int>(i) == guide.recommended ? "**yes**" : "yes")
                              : fmt::format("no (batch 1: {})", !gpu_ok ? "GPU" : host_ok ? "?" : "host"));
  }
  if (guide.recommended < 0) {
    out += fmt::format("\nNothing fits in {} GiB per GPU{} even at batch 1: use more GPUs (--gpus), a shorter "
                       "context_length, or a smaller lora_rank.\n",
                       flags.gpu_mem_gib, flags.host_mem_gib > 0 ? fmt::format(" and {} GiB per node", flags.host_mem_gib) : "");
  } else {
    const GuideStep& g = guide.steps[static_cast<size_t>(guide.recommended)];
    out += fmt::format("\nRecommended: step {} ({}): {}; {} GiB per GPU, {} GiB host per node.\n  {}\n",
                       guide.recommended + 1, g.name, setting_text(g.setting), gib(g.prediction.gpu_required),
                       gib(g.prediction.host_per_node), setting_flags(g.setting));
    if (g.setting.activation_offload)
      out += "  (with use_activation_cpu_offload the layer inputs wait in pinned host memory, copied beside the compute)\n";
    out += activation_offload_note(input, g, flags.host_mem_gib);
  }
  out += packing_note(c);
  return out;
}

}  // namespace

int run_plan_command(const World& world, const std::vector<std::string>& args) {
  if (wants_help(args)) {
    log::info("{}", kPlanHelp);
    return kExitOk;
  }
  PlanFlags flags;
  run_on_all_ranks(world, [&] { flags = parse_plan_flags(args); });
  const ResolvedConfig resolved = resolve_train_arguments(world, flags.rest);
  std::string report;
  run_on_all_ranks(world, [&] {
    const TrainConfig& c = resolved.config;
    const ModelSource source = open_model_source(c.model_name);
    const int gpus = flags.gpus > 0 ? flags.gpus : c.world_size > 0 ? static_cast<int>(c.world_size) : 1;
    if (c.ranks_per_node > gpus)
      fail("plan: ranks_per_node = {} is more than the {} GPU{} planned for (--gpus)", c.ranks_per_node, gpus,
           gpus == 1 ? "" : "s");
    const PlanInput input = plan_input_from(c, source.config, gpus);
    const GuideResult guide = walk_guide(input, static_cast<int64_t>(flags.gpu_mem_gib * kGiB),
                                         static_cast<int64_t>(flags.host_mem_gib * kGiB), flags.max_batch);
    report = format_plan(c, input, flags, guide);
  });
  log::info("{}", report);
  return kExitOk;
}

}  // namespace fsdpq
