#include "config/config_loader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "config/ini_file.h"
#include "config/options.h"
#include "quant/hqq.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;

std::string ValueSource::describe() const {
  switch (kind) {
    case Kind::Default: return "default";
    case Kind::CommandLine: return "command line";
    case Kind::File: return fmt::format("{}:{}", file, line);
  }
  return "?";
}

std::string ResolvedConfig::cite(const std::string& key) const {
  auto t = text.find(key);
  auto s = sources.find(key);
  return fmt::format("{} = {} ({})", key, t == text.end() ? "?" : t->second,
                     s == sources.end() ? "default" : s->second.describe());
}

namespace {

const std::vector<std::string> kAllTargets = {"k_proj", "q_proj", "v_proj", "up_proj", "down_proj", "gate_proj"};
const std::vector<std::string> kDefaultTargets = {"q_proj", "v_proj"};

std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:g}", v);
}

std::string choices_text(const OptionSpec& spec) {
  std::vector<std::string> c(spec.choices.begin(), spec.choices.end());
  return join(c, ", ");
}

// Parses one value into the config field. Returns an error text ("" when fine).
std::string assign_value(const OptionSpec& spec, const std::string& value, TrainConfig& config) {
  auto range_error = [&](double v) -> std::string {
    if (v < spec.min) return fmt::format("must be at least {}", format_number(spec.min));
    if (v > spec.max) return fmt::format("must be at most {}", format_number(spec.max));
    return "";
  };
  switch (spec.type) {
    case OptionType::Bool: {
      auto v = parse_bool(value);
      if (!v) return "expected true or false";
      config.*std::get<bool TrainConfig::*>(spec.field) = *v;
      return "";
    }
    case OptionType::Int: {
      auto v = parse_int(value);
      if (!v) return "expected an integer";
      if (auto e = range_error(static_cast<double>(*v)); !e.empty()) return e;
      config.*std::get<int64_t TrainConfig::*>(spec.field) = *v;
      return "";
    }
    case OptionType::Float: {
      auto v = parse_double(value);
      if (!v) return "expected a number";
      if (auto e = range_error(*v); !e.empty()) return e;
      config.*std::get<double TrainConfig::*>(spec.field) = *v;
      return "";
    }
    case OptionType::Enum: {
      std::string v = to_lower(value);
      for (auto c : spec.choices)
        if (c == v) {
          config.*std::get<std::string TrainConfig::*>(spec.field) = v;
          return "";
        }
      for (const auto& ni : spec.not_implemented)
        if (ni.value == v) return fmt::format("not supported: {} (supported: {})", ni.reason, choices_text(spec));
      std::vector<std::string> c(spec.choices.begin(), spec.choices.end());
      std::string guess = closest_match(v, c);
      return fmt::format("expected one of {}{}", choices_text(spec),
                         guess.empty() ? "" : fmt::format(" (did you mean {}?)", guess));
    }
    case OptionType::List: {
      std::string v = to_lower(trim(value));
      std::vector<std::string> items;
      if (v == "all") items = kAllTargets;
      else if (v == "default") items = kDefaultTargets;
      else {
        std::vector<std::string> c(spec.choices.begin(), spec.choices.end());
        for (const auto& item : split(v, ',')) {
          if (item.empty()) return "empty item in the list";
          if (std::find(c.begin(), c.end(), item) == c.end()) {
            std::string guess = closest_match(item, c);
            return fmt::format("'{}' is not one of all, default, {}{}", item, choices_text(spec),
                               guess.empty() ? "" : fmt::format(" (did you mean {}?)", guess));
          }
          if (std::find(items.begin(), items.end(), item) != items.end())
            return fmt::format("'{}' is listed twice", item);
          items.push_back(item);
        }
      }
      config.*std::get<std::vector<std::string> TrainConfig::*>(spec.field) = items;
      return "";
    }
    case OptionType::String:
    case OptionType::InputFile:
    case OptionType::OutputPath:
      config.*std::get<std::string TrainConfig::*>(spec.field) = value;
      return "";
  }
  return "unhandled option type";
}

// fsdp_qlora keys that fsdpq does another way: what to set instead ("" for any other key).
std::string instead_of_fsdp_qlora_key(const std::string& key) {
  if (key == "llama_pro_path")
    return "fsdpq expands the model while loading (docs/llama_pro.md): set model_name to the original model and "
           "llama_pro_num_new_blocks to M - L for block_expansion.py's folder blk_exp-L-M";
  return "";
}

struct Resolver {
  ResolvedConfig out;
  std::vector<std::string> errors;

  void set(const OptionSpec& spec, const std::string& value, const ValueSource& source, const std::string& where) {
    std::string err = assign_value(spec, value, out.config);
    if (!err.empty()) {
      if (source.kind == ValueSource::Kind::CommandLine)
        errors.push_back(fmt::format("command line: --{} {}: {}", spec.name, value, err));
      else
        errors.push_back(fmt::format("{}: {} = \"{}\": {}", where, spec.name, value, err));
      return;
    }
    out.text[std::string(spec.name)] = value;
    out.sources[std::string(spec.name)] = source;
  }

  void unknown_key(const std::string& key, const std::string& where, const std::string& dashes) {
    if (const std::string instead = instead_of_fsdp_qlora_key(key); !instead.empty()) {
      errors.push_back(fmt::format("{}: '{}{}' is not a setting of fsdpq: {}", where, dashes, key, instead));
      return;
    }
    std::string guess = closest_match(key, option_names());
    errors.push_back(fmt::format("{}: '{}{}' is not a known setting{}", where, dashes, key,
                                 guess.empty() ? " (fsdpq --help lists them)"
                                               : fmt::format(" (did you mean '{}{}'?)", dashes, guess)));
  }

  void throw_if_errors() {
    if (errors.empty()) return;
    if (errors.size() == 1) throw UserError(errors[0]);
    throw UserError(fmt::format("{} problems in the configuration:\n  {}", errors.size(), join(errors, "\n  ")));
  }
};

// The choice settings as enums, once (the option table has checked their spelling already).
void parse_choices(TrainConfig& c) {
  c.choice.train_type = c.train_type == "full"                                 ? TrainType::Full
                        : c.train_type == "lora" || c.train_type == "custom_lora" ? TrainType::Lora
                        : c.train_type == "hqq_lora"                              ? TrainType::HqqLora
                        : c.train_type == "bnb_dora"                              ? TrainType::BnbDora
                        : c.train_type == "hqq_dora"                              ? TrainType::HqqDora
                        : c.train_type == "bnb_llama_pro"                         ? TrainType::BnbLlamaPro
                        : c.train_type == "hqq_llama_pro"                         ? TrainType::HqqLlamaPro
                                                                                  : TrainType::Qlora;
  c.choice.precision = parse_precision(c.precision);
  c.choice.optimizer = parse_optimizer(c.optimizer);
  c.choice.lr_scheduler = parse_lr_schedule(c.lr_scheduler);
  c.choice.sharding = parse_sharding_strategy(c.sharding_strategy);
}

bool is_set(const ResolvedConfig& r, const std::string& key) {
  auto it = r.sources.find(key);
  return it != r.sources.end() && it->second.kind != ValueSource::Kind::Default;
}

void check_input_file(const ResolvedConfig& r, const std::string& key, const std::string& path, bool allow_dir) {
  if (path.empty()) return;
  std::error_code ec;
  if (!fs::exists(path, ec))
    fail("{}: file not found (relative paths are resolved from the working directory {})", r.cite(key),
         fs::current_path().string());
  if (!allow_dir && fs::is_directory(path, ec)) fail("{}: is a directory, expected a file", r.cite(key));
}

// Checks that need more than one key, or the file system. Each names every key involved.
void validate_combinations(ResolvedConfig& r) {
  TrainConfig& c = r.config;
  auto contradiction = [&](const std::string& a, const std::string& b, const std::string& why) {
    fail("{} contradicts {}: {}", r.cite(a), r.cite(b), why);
  };

  // Model and tokenizer.
  if (c.model_name.empty()) fail("{}: expected a model directory or preset:NAME", r.cite("model_name"));
  if (!starts_with(c.model_name, "preset:")) {
    std::error_code ec;
    if (!fs::is_directory(c.model_name, ec))
      fail("{}: model directory not found (use preset:NAME for a random-initialised model, or "
           "`fsdpq init-model --preset NAME --out DIR` to write one)", r.cite("model_name"));
  }
  if (c.tokenizer_path != "builtin:bytes") check_input_file(r, "tokenizer_path", c.tokenizer_path, true);

  // Quantisation width: hqq packs 1, 2, 3, 4 or 8 bits; the other train types are 4-bit or none
  // (fsdp_qlora refuses n_bits != 4 for them too).
  if (c.hqq_base() && !hqq_supported_bits(static_cast<int>(c.n_bits)))
    fail("{}: {} quantises to 1, 2, 3, 4 or 8 bits", r.cite("n_bits"), c.train_type);
  if (!c.hqq_base() && c.n_bits != 4)
    contradiction("n_bits", "train_type", fmt::format("only the hqq train types take another width than 4; {} "
                                                      "does not (use train_type hqq_lora or hqq_dora, or leave n_bits at 4)",
                                                      c.train_type));

  // Llama-Pro: how many blocks it adds is the user's to say (whether the model's layer count takes
  // it is checked once the model's config is read: model/block_expansion.h).
  if (c.llama_pro() && c.llama_pro_num_new_blocks < 1)
    fail("{}: train_type {} adds this many new decoder layers; set it to at least 1 (LLaMA-Pro-8B adds 8 to "
         "Llama-2-7B's 32)",
         r.cite("llama_pro_num_new_blocks"), c.train_type);
  if (!c.llama_pro() && c.llama_pro_num_new_blocks != 0)
    contradiction("llama_pro_num_new_blocks", "train_type",
                  fmt::format("only bnb_llama_pro and hqq_llama_pro add blocks; {} does not", c.train_type));

  // Data.
  const bool generated = c.dataset == "dummy" || c.dataset == "synthetic";
  if (generated && !c.data_path.empty())
    contradiction("dataset", "data_path", fmt::format("dataset {} generates its records; remove data_path", c.dataset));
  if (!generated && c.data_path.empty())
    fail("{}: this dataset is read from a local file: set data_path to its JSONL or JSON file "
         "(fsdpq downloads nothing)", r.cite("dataset"));
  check_input_file(r, "data_path", c.data_path, false);
  check_input_file(r, "eval_data_path", c.eval_data_path, false);
  if (!c.eval_data_path.empty() && c.eval_fraction > 0)
    contradiction("eval_data_path", "eval_fraction", "hold out a fraction or give an eval file, not both");
  if (c.eval_every_steps > 0 && c.eval_data_path.empty() && c.eval_fraction == 0)
    fail("{}: there is no eval data: set eval_data_path or eval_fraction", r.cite("eval_every_steps"));

  // packing and pad_to_context_length choose the rows' layout over padding_free (inputs/sql.ini sets
  // it, so `--packing true` on that file must not need a second flag): said, not ignored.
  auto layout_wins = [&](const char* key, bool on, const char* why) {
    if (!c.padding_free || !on) return;
    r.warnings.push_back(fmt::format("{} has no effect with {}: {}", r.cite("padding_free"), r.cite(key), why));
    c.padding_free = false;
  };
  layout_wins("packing", c.packing, "packed rows already lay examples end to end (batch_size counts rows)");
  layout_wins("pad_to_context_length", c.pad_to_context_length, "every row is padded to context_length");

  // Training.
  if (c.max_steps == 0) fail("{}: must be -1 (no limit) or at least 1", r.cite("max_steps"));

  // Sharding and offload.
  if (c.use_cpu_offload && c.choice.sharding == ShardingStrategy::Ddp)
    contradiction("use_cpu_offload", "sharding_strategy",
                  "CPU offload moves sharded state to the host; use full_shard, shard_grad_op or a hybrid strategy");
  if (c.checkpoint_every != 1 && !c.use_gradient_checkpointing)
    contradiction("checkpoint_every", "use_gradient_checkpointing",
                  "it says which layers checkpointing recomputes, so it needs use_gradient_checkpointing = true");
  if (c.keep_activation_layers > 0 && !c.use_gradient_checkpointing)
    contradiction("keep_activation_layers", "use_gradient_checkpointing",
                  "it says which layers checkpointing leaves out, so it needs use_gradient_checkpointing = true "
                  "(without checkpointing every layer keeps its activations)");
  if (c.recompute_elementwise && c.use_gradient_checkpointing && c.checkpoint_every == 1 && c.keep_activation_layers == 0)
    contradiction("recompute_elementwise", "use_gradient_checkpointing",
                  "it trims the activations of the layers that keep theirs, and with checkpointing on every layer "
                  "(checkpoint_every = 1, keep_activation_layers = 0) none does: turn checkpointing off, or set "
                  "checkpoint_every above 1 or keep_activation_layers above 0");
  if (c.keep_dequantized_layers > 0 && !c.quantized_base())
    contradiction("keep_dequantized_layers", "train_type",
                  fmt::format("it keeps dequantised base weights, and train_type = {} has no quantised base "
                              "(qlora, hqq_lora, bnb_dora and hqq_dora do)",
                              c.train_type));
  if (c.use_activation_cpu_offload && !c.use_gradient_checkpointing)
    contradiction("use_activation_cpu_offload", "use_gradient_checkpointing",
                  "activation offload moves the checkpointed layer inputs, so it needs gradient checkpointing");
  if (is_set(r, "ranks_per_node") && !c.hybrid())
    r.warnings.push_back(fmt::format("{} has no effect with sharding_strategy = {}", r.cite("ranks_per_node"),
                                     c.sharding_strategy));

  // Checkpoints.
  if (c.checkpoint_dir.empty()) c.checkpoint_dir = (fs::path(c.output_dir) / "checkpoints").string();
  if (!c.resume.empty() && c.resume != "auto") check_input_file(r, "resume", c.resume, false);
  if (c.overwrite && !c.resume.empty())
    contradiction("overwrite", "resume", "a resumed run continues the previous run's files; overwrite replaces them");
  if (c.resume_ignore_model && c.resume.empty())
    r.warnings.push_back(fmt::format("{} has no effect without resume", r.cite("resume_ignore_model")));

  // Settings that are accepted but would do nothing: say so rather than ignore them silently.
  if (!c.is_lora())
    for (const char* key : {"lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules"})
      if (is_set(r, key))
        r.warnings.push_back(fmt::format("{} has no effect with train_type = {}", r.cite(key), c.train_type));
  if (c.no_sync && c.gradient_accumulation_steps == 1)
    r.warnings.push_back(fmt::format("{} has no effect with gradient_accumulation_steps = 1", r.cite("no_sync")));
  if (!c.apply_gradient_clipping && is_set(r, "grad_norm"))
    r.warnings.push_back(fmt::format("{} has no effect unless apply_gradient_clipping = true", r.cite("grad_norm")));
  if (c.choice.precision != Precision::FP16Autocast)
    for (const char* key : {"loss_scale_init", "loss_scale_growth_interval"})
      if (is_set(r, key)) r.warnings.push_back(fmt::format("{} has no effect unless precision = fp16_autocast", r.cite(key)));
  if (c.choice.lr_scheduler != LrScheduleKind::cosine && is_set(r, "min_lr_fraction"))
    r.warnings.push_back(fmt::format("{} only affects lr_scheduler = cosine", r.cite("min_lr_fraction")));
}

ResolvedConfig resolve(const std::vector<IniEntry>& entries, const std::string& file_name,
                       const std::vector<ConfigOverride>& overrides) {
  Resolver res;
  res.out.config_path = file_name;
  for (const auto& spec : option_specs()) {
    std::string err = assign_value(spec, std::string(spec.default_value), res.out.config);
    if (!err.empty()) throw std::logic_error(fmt::format("default of {} is invalid: {}", spec.name, err));
    res.out.text[std::string(spec.name)] = std::string(spec.default_value);
    res.out.sources[std::string(spec.name)] = ValueSource{};
  }
  for (const auto& e : entries) {
    std::string where = fmt::format("{}:{}", file_name, e.line);
    const OptionSpec* spec = find_option(e.key);
    if (!spec) {
      res.unknown_key(e.key, where, "");
      continue;
    }
    res.set(*spec, e.value, ValueSource{ValueSource::Kind::File, file_name, e.line}, where);
  }
  // In order: a key given twice on the command line takes its last value (as argparse does), so
  // scripts may append overrides after their defaults. Within one .ini a repeated key stays an error.
  for (const auto& o : overrides) {
    const OptionSpec* spec = find_option(o.key);
    if (!spec) {
      res.unknown_key(o.key, "command line", "--");
      continue;
    }
    res.set(*spec, o.value, ValueSource{ValueSource::Kind::CommandLine, "", 0}, "command line");
  }
  res.throw_if_errors();
  parse_choices(res.out.config);
  validate_combinations(res.out);
  return res.out;
}

}  // namespace

ResolvedConfig resolve_config(const std::optional<fs::path>& ini_path, const std::vector<ConfigOverride>& overrides) {
  std::vector<IniEntry> entries;
  std::string name;
  if (ini_path) {
    entries = read_ini_file(*ini_path);
    name = ini_path->string();
  }
  return resolve(entries, name, overrides);
}

ResolvedConfig resolve_config_text(const std::string& ini_text, const std::string& name,
                                   const std::vector<ConfigOverride>& overrides) {
  return resolve(parse_ini(ini_text, name), name, overrides);
}

std::string format_resolved_config(const ResolvedConfig& r) {
  std::string out;
  std::string section;
  size_t width = 0;
  for (const auto& spec : option_specs())
    width = std::max(width, spec.name.size() + 3 + r.text.at(std::string(spec.name)).size());
  for (const auto& spec : option_specs()) {
    if (spec.section != section) {
      section = std::string(spec.section);
      out += fmt::format("{}[{}]\n", out.empty() ? "" : "\n", section);
    }
    std::string key(spec.name);
    std::string line = fmt::format("{} = {}", key, r.text.at(key));
    out += fmt::format("{:<{}}  # {}\n", line, width, r.sources.at(key).describe());
  }
  return out;
}

std::string config_reference_markdown() {
  std::string out =
      "# Configuration reference\n\n"
      "Generated from `src/config/options.cpp` by `fsdpq --help-config`; `make test` fails when this "
      "file and the program disagree.\n\n"
      "Settings are read from an `.ini` file (`key = value`; `[sections]` group keys and may hold any "
      "key; `#` or `;` start a comment) and may be overridden on the command line with `--key value` "
      "or `--key=value`. Relative paths are resolved from the working directory. "
      "`fsdpq --print-config FILE.ini` shows the resolved values and where each came from.\n";
  std::string section;
  for (const auto& spec : option_specs()) {
    if (spec.section != section) {
      section = std::string(spec.section);
      out += fmt::format("\n## [{}]\n\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n", section);
    }
    std::string allowed;
    switch (spec.type) {
      case OptionType::Enum:
      case OptionType::List:
        allowed = choices_text(spec);
        break;
      case OptionType::Int:
      case OptionType::Float:
        allowed = fmt::format("{} … {}", format_number(spec.min), format_number(spec.max));
        break;
      case OptionType::Bool:
        allowed = "true, false";
        break;
      default:
        break;
    }
    if (!spec.special_values.empty()) allowed = allowed.empty() ? std::string(spec.special_values)
                                                                : std::string(spec.special_values) + ", " + allowed;
    std::string help(spec.help);
    for (const auto& ni : spec.not_implemented) help += fmt::format(" Not implemented: `{}`.", ni.value);
    out += fmt::format("| `{}` | {} | `{}` | {} | {} |\n", spec.name, option_type_name(spec.type),
                       spec.default_value.empty() ? "\"\"" : std::string(spec.default_value), allowed, help);
  }
  return out;
}

}  // namespace fsdpq
