#include "io/peft_adapter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

#include "io/model_files.h"
#include "io/safetensors.h"
#include "model/llama_config.h"
#include "ops/lora.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

// PEFT's default targets for Llama when target_modules is null
// (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["llama"]).
const std::vector<std::string> kPeftDefaultLlamaTargets = {"q_proj", "v_proj"};

bool is_attention_module(std::string_view module) {
  return module == "q_proj" || module == "k_proj" || module == "v_proj" || module == "o_proj";
}
const char* parent_of(std::string_view module) { return is_attention_module(module) ? "self_attn" : "mlp"; }

int module_order(std::string_view module) {
  const auto& names = linear_module_names();
  return static_cast<int>(std::find(names.begin(), names.end(), module) - names.begin());
}
bool is_linear_module(std::string_view module) {
  return module_order(module) < static_cast<int>(linear_module_names().size());
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::vector<std::string> parts;
  for (int64_t d : shape) parts.push_back(std::to_string(d));
  return "[" + join(parts, ", ") + "]";
}

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot open '{}': {}", path.string(), std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) fail("cannot read '{}': {}", path.string(), std::strerror(errno));
  return text.str();
}

// Checks a target_modules list: known Llama linears, no duplicates.
void check_targets(const std::vector<std::string>& targets, const std::string& where) {
  if (targets.empty()) fail("{}: target_modules is empty; list the linear modules the adapter applies to", where);
  std::set<std::string> seen;
  for (const std::string& t : targets) {
    if (!is_linear_module(t)) {
      std::string guess = closest_match(t, linear_module_names());
      fail("{}: target module '{}' is not a Llama decoder linear{} (fsdpq adapts {})", where, t,
           guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess), join(linear_module_names(), ", "));
    }
    if (!seen.insert(t).second) fail("{}: target module '{}' is listed twice", where, t);
  }
}

// A JSON value that PEFT writes as "unused": null, false, an empty list or an empty object.
bool is_unset(const nlohmann::json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || ((v.is_array() || v.is_object()) && v.empty());
}

}  // namespace

// ---- Names ---------------------------------------------------------------------------------------

std::string AdapterTensorName::base_weight_name() const {
  return fmt::format("model.layers.{}.{}.{}.weight", layer, parent_of(module), module);
}
std::string AdapterTensorName::peft_name() const {
  return is_magnitude ? magnitude_tensor_name(layer, module) : adapter_tensor_name(layer, module, is_a);
}

std::string magnitude_tensor_name(int64_t layer, std::string_view module) {
  return fmt::format("base_model.model.model.layers.{}.{}.{}.lora_magnitude_vector", layer, parent_of(module), module);
}

std::string adapter_tensor_name(int64_t layer, std::string_view module, bool is_a) {
  return fmt::format("base_model.model.model.layers.{}.{}.{}.lora_{}.weight", layer, parent_of(module), module,
                     is_a ? 'A' : 'B');
}

std::optional<AdapterTensorName> parse_adapter_tensor_name(std::string_view name) {
  // Canonical layer numbers only (no "01"), so that two spellings cannot name one tensor.
  static const std::regex pattern(
      R"(base_model\.model\.model\.layers\.(0|[1-9][0-9]{0,8})\.(self_attn|mlp)\.([a-z_]+)\.lora_(?:(A|B)(\.default)?\.weight|(magnitude_vector)(\.default(\.weight)?)?))");
  std::match_results<std::string_view::const_iterator> m;
  if (!std::regex_match(name.begin(), name.end(), m, pattern)) return std::nullopt;
  AdapterTensorName out;
  out.layer = std::stoll(m[1].str());
  out.module = m[3].str();
  out.is_magnitude = m[6].matched;
  out.is_a = !out.is_magnitude && m[4].str() == "A";
  if (!is_linear_module(out.module) || m[2].str() != parent_of(out.module)) return std::nullopt;
  return out;
}

// ---- Config --------------------------------------------------------------------------------------

nlohmann::json adapter_config_json(const AdapterConfig& config) {
  nlohmann::json j = nlohmann::json::object();
  // PEFT writes lora_alpha as the int it usually is; keep a fractional alpha exact.
  nlohmann::json alpha = config.lora_alpha;
  if (std::isfinite(config.lora_alpha) && config.lora_alpha == std::floor(config.lora_alpha) &&
      std::fabs(config.lora_alpha) < 1e15)
    alpha = static_cast<int64_t>(config.lora_alpha);
  j["alpha_pattern"] = nlohmann::json::object();
  j["auto_mapping"] = nullptr;
  j["base_model_name_or_path"] =
      config.base_model_name_or_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(config.base_model_name_or_path);
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["loftq_config"] = nlohmann::json::object();
  j["lora_alpha"] = alpha;
  j["lora_dropout"] = config.lora_dropout;
  j["megatron_config"] = nullptr;
  j["megatron_core"] = "megatron.core";
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = config.r;
  j["rank_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  j["target_modules"] = config.target_modules;
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = config.use_dora;
  j["use_rslora"] = false;
  return j;
}

namespace {

AdapterConfig parse_adapter_config(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) fail("{}: expected a JSON object, found {}", where, j.type_name());
  AdapterConfig c;
  if (!j.contains("peft_type") || !j["peft_type"].is_string())
    fail("{}: peft_type is missing; a PEFT LoRA adapter has \"peft_type\": \"LORA\"", where);
  const std::string peft_type = j["peft_type"].get<std::string>();
  if (peft_type != "LORA")
    fail("{}: peft_type is '{}'; fsdpq reads LoRA adapters only (\"peft_type\": \"LORA\")", where, peft_type);

  auto field = [&](const char* key) -> const nlohmann::json* {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  };
  const nlohmann::json* r = field("r");
  if (!r || !r->is_number_integer() || r->get<int64_t>() < 1 || r->get<int64_t>() > 1'000'000)
    fail("{}: key 'r' must be a positive integer (the LoRA rank), found {}", where, r ? r->dump() : "nothing");
  c.r = r->get<int64_t>();
  const nlohmann::json* alpha = field("lora_alpha");
  if (!alpha) {
    c.lora_alpha = 8;  // PEFT's default
  } else {
    if (!alpha->is_number() || !std::isfinite(alpha->get<double>()))
      fail("{}: key 'lora_alpha' must be a number, found {}", where, alpha->dump());
    c.lora_alpha = alpha->get<double>();
  }
  if (const nlohmann::json* dropout = field("lora_dropout")) {
    if (!dropout->is_number() || !valid_lora_dropout(dropout->get<double>()))
      fail("{}: key 'lora_dropout' must be a number in [0, 1), found {}", where, dropout->dump());
    c.lora_dropout = dropout->get<double>();
  }
  const nlohmann::json* targets = field("target_modules");
  if (!targets) {
    c.target_modules = kPeftDefaultLlamaTargets;
  } else if (targets->is_string()) {
    if (targets->get<std::string>() != "all-linear")
      fail("{}: target_modules is the regular expression '{}', which fsdpq does not apply; list the module "
           "names instead (e.g. [\"q_proj\", \"v_proj\"])", where, targets->get<std::string>());
    c.target_modules = linear_module_names();
  } else if (targets->is_array()) {
    for (const auto& t : *targets) {
      if (!t.is_string()) fail("{}: target_modules must be a list of module names, found {}", where, t.dump());
      c.target_modules.push_back(t.get<std::string>());
    }
    check_targets(c.target_modules, where);
  } else {
    fail("{}: target_modules must be a list of module names, found {}", where, targets->type_name());
  }
  if (const nlohmann::json* base = field("base_model_name_or_path")) {
    if (!base->is_string()) fail("{}: key 'base_model_name_or_path' must be a string, found {}", where, base->dump());
    c.base_model_name_or_path = base->get<std::string>();
  }

  // What changes the adapter's arithmetic beyond W + (alpha / r)·B·A: refused rather than ignored.
  if (const nlohmann::json* bias = field("bias"); bias && *bias != "none")
    fail("{}: bias is {}; fsdpq applies adapters without biases (\"bias\": \"none\")", where, bias->dump());
  struct Unsupported {
    const char* key;
    const char* what;
  };
  if (const nlohmann::json* dora = field("use_dora"); dora && !dora->is_null()) {
    if (!dora->is_boolean()) fail("{}: key 'use_dora' must be true or false, found {}", where, dora->dump());
    c.use_dora = dora->get<bool>();
  }
  for (const Unsupported& u : {Unsupported{"use_rslora", "rank-stabilised LoRA (scaling alpha/sqrt(r))"},
                               Unsupported{"fan_in_fan_out", "fan_in_fan_out (transposed Conv1D weights)"},
                               Unsupported{"rank_pattern", "per-module ranks (rank_pattern)"},
                               Unsupported{"alpha_pattern", "per-module alphas (alpha_pattern)"},
                               Unsupported{"modules_to_save", "fully trained extra modules (modules_to_save)"},
                               Unsupported{"layers_to_transform", "adapters on some layers only (layers_to_transform)"},
                               Unsupported{"layer_replication", "layer replication"},
                               Unsupported{"lora_bias", "LoRA biases (lora_bias)"},
                               Unsupported{"use_qalora", "QA-LoRA"},
                               Unsupported{"trainable_token_indices", "trainable token embeddings"},
                               Unsupported{"target_parameters", "adapters on parameters (target_parameters)"},
                               Unsupported{"alora_invocation_tokens", "activated LoRA"}}) {
    if (const nlohmann::json* v = field(u.key); v && !is_unset(*v))
      fail("{}: {} is {}; fsdpq does not support {}", where, u.key, v->dump(), u.what);
  }
  return c;
}

}  // namespace

AdapterConfig load_adapter_config(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("adapter directory '{}' does not exist or is not a directory", dir.string());
  const fs::path path = dir / kAdapterConfigFile;
  if (!fs::is_regular_file(path, ec))
    fail("adapter directory '{}' has no {} (a PEFT adapter has {} and {})", dir.string(), kAdapterConfigFile,
         kAdapterConfigFile, kAdapterWeightsFile);
  const std::string where = fmt::format("'{}'", path.string());
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: not valid JSON (error at byte {})", where, e.byte);
  }
  return parse_adapter_config(j, where);
}

// ---- Saving --------------------------------------------------------------------------------------

void save_peft_adapter(const fs::path& dir, const AdapterConfig& config,
                       const std::vector<std::pair<std::string, const Tensor*>>& tensors, DType dtype) {
  const std::string where = fmt::format("saving the adapter to '{}'", dir.string());
  if (dtype != DType::F32 && dtype != DType::BF16)
    fail("{}: adapters are stored as F32 or BF16, not {}", where, dtype_name(dtype));
  if (config.r < 1) fail("{}: r must be positive, found {}", where, config.r);
  if (!valid_lora_dropout(config.lora_dropout))
    fail("{}: lora_dropout must be in [0, 1), found {}", where, config.lora_dropout);
  check_targets(config.target_modules, where);
  if (tensors.empty()) fail("{}: no adapter tensors to save", where);

  // Every tensor a canonical PEFT name of a targeted module, shapes agreeing with r, pairs whole.
  std::set<std::string> names;
  std::set<std::string> targets(config.target_modules.begin(), config.target_modules.end());
  std::vector<TensorSpec> specs;
  for (const auto& [name, tensor] : tensors) {
    auto parsed = parse_adapter_tensor_name(name);
    if (!parsed || parsed->peft_name() != name)
      fail("{}: '{}' is not a PEFT LoRA tensor name (expected e.g. {})", where, name, adapter_tensor_name(0, "q_proj", true));
    if (!targets.count(parsed->module))
      fail("{}: tensor '{}' adapts {}, which target_modules ({}) does not list", where, name, parsed->module,
           join(config.target_modules, ", "));
    if (!names.insert(name).second) fail("{}: tensor '{}' is given twice", where, name);
    if (parsed->is_magnitude && !config.use_dora)
      fail("{}: tensor '{}' is a DoRA magnitude but the config's use_dora is false", where, name);
    const int want_rank = parsed->is_magnitude ? 1 : 2;
    if (!tensor || !tensor->defined() || tensor->dtype() != DType::F32 || tensor->device() != Device::CPU ||
        tensor->shape().rank != want_rank)
      fail("{}: tensor '{}' must be a {}-D F32 tensor on the CPU, found {}", where, name, want_rank,
           tensor && tensor->defined() ? tensor->view().describe() : "nothing");
    if (parsed->is_magnitude) {
      specs.push_back(TensorSpec{name, dtype, {tensor->shape()[0]}});
      continue;
    }
    const int64_t rank_dim = parsed->is_a ? tensor->shape()[0] : tensor->shape()[1];
    if (rank_dim != config.r)
      fail("{}: tensor '{}' has shape {}, which does not agree with r = {}", where, name, tensor->shape().to_string(),
           config.r);
    specs.push_back(TensorSpec{name, dtype, {tensor->shape()[0], tensor->shape()[1]}});
  }
  for (const std::string& name : names) {
    auto parsed = parse_adapter_tensor_name(name);
    std::vector<std::string> partners = {adapter_tensor_name(parsed->layer, parsed->module, true),
                                         adapter_tensor_name(parsed->layer, parsed->module, false)};
    if (config.use_dora) partners.push_back(magnitude_tensor_name(parsed->layer, parsed->module));
    for (const std::string& partner : partners)
      if (!names.count(partner)) fail("{}: tensor '{}' has no partner '{}'", where, name, partner);
  }

  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    fail("cannot create the adapter directory '{}': {}", dir.string(), ec ? ec.message() : "not a directory");
  // Without its config the directory is not an adapter, so a reader never pairs the old config
  // with new weights while the save is in progress.
  fs::remove(dir / kAdapterConfigFile, ec);
  if (ec) fail("cannot remove the earlier '{}': {}", (dir / kAdapterConfigFile).string(), ec.message());

  SafetensorsWriter writer(dir / kAdapterWeightsFile, specs, {{"format", "pt"}});
  std::vector<uint16_t> staged;
  for (const auto& [name, tensor] : tensors) {
    const float* values = tensor->data<float>();
    const size_t n = static_cast<size_t>(tensor->numel());
    if (dtype == DType::F32) {
      writer.write(std::as_bytes(std::span(values, n)));
    } else {
      staged.resize(n);
      for (size_t i = 0; i < n; ++i) staged[i] = float_to_bf16(values[i]);
      writer.write(std::as_bytes(std::span(staged.data(), n)));
    }
  }
  writer.finish();
  // PEFT's json.dumps(indent=2, sort_keys=True): nlohmann objects are sorted maps; no final newline.
  write_file_atomically(dir / kAdapterConfigFile, adapter_config_json(config).dump(2));
  sync_directory(dir);
}

// ---- Loading -------------------------------------------------------------------------------------

const Tensor* LoadedAdapter::find(std::string_view name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

LoadedAdapter load_peft_adapter(const fs::path& dir) {
  LoadedAdapter out;
  out.config = load_adapter_config(dir);
  std::error_code ec;
  const fs::path path = dir / kAdapterWeightsFile;
  if (!fs::is_regular_file(path, ec)) {
    std::string hint;
    if (fs::exists(dir / "adapter_model.bin", ec))
      hint = "; it holds adapter_model.bin (PyTorch pickle), which fsdpq does not read: save the adapter with "
             "safe_serialization=True";
    fail("adapter directory '{}' has no {}{}", dir.string(), kAdapterWeightsFile, hint);
  }
  const SafetensorsFile file = SafetensorsFile::open(path);
  const std::string where = fmt::format("adapter '{}'", path.string());
  const std::set<std::string> targets(out.config.target_modules.begin(), out.config.target_modules.end());

  struct Entry {
    AdapterTensorName name;
    const TensorInfo* info;
  };
  std::map<std::string, Entry> by_name;  // canonical name → tensor in the file
  for (const TensorInfo& t : file.tensors()) {
    auto parsed = parse_adapter_tensor_name(t.name);
    if (!parsed)
      fail("{}: tensor '{}' is not a LoRA weight of a Llama linear (expected names like {})", where, t.name,
           adapter_tensor_name(0, "q_proj", true));
    if (!targets.count(parsed->module))
      fail("{}: tensor '{}' adapts {}, which target_modules ({}) in {} does not list", where, t.name, parsed->module,
           join(out.config.target_modules, ", "), kAdapterConfigFile);
    if (t.dtype != DType::F32 && t.dtype != DType::BF16 && t.dtype != DType::F16)
      fail("{}: tensor '{}' is {}, expected F32, BF16 or F16", where, t.name, dtype_name(t.dtype));
    const std::string canonical = parsed->peft_name();
    if (parsed->is_magnitude) {
      if (!out.config.use_dora)
        fail("{}: tensor '{}' is a DoRA magnitude vector but {} does not set \"use_dora\": true", where, t.name,
             kAdapterConfigFile);
      if (t.shape.size() != 1 || t.shape[0] == 0)
        fail("{}: tensor '{}' has shape {}, expected a vector [out_features]", where, t.name, shape_string(t.shape));
      if (!by_name.emplace(canonical, Entry{*parsed, &t}).second)
        fail("{}: tensor '{}' appears twice (with and without the adapter name 'default')", where, canonical);
      continue;
    }
    if (t.shape.size() != 2)
      fail("{}: tensor '{}' has shape {}, expected a matrix {}", where, t.name, shape_string(t.shape),
           parsed->is_a ? "[r, in_features]" : "[out_features, r]");
    const int64_t rank_dim = parsed->is_a ? t.shape[0] : t.shape[1];
    if (rank_dim != out.config.r || t.shape[0] == 0 || t.shape[1] == 0)
      fail("{}: tensor '{}' has shape {}, expected {} with r = {} ({})", where, t.name, shape_string(t.shape),
           parsed->is_a ? "[r, in_features]" : "[out_features, r]", out.config.r, kAdapterConfigFile);
    if (!by_name.emplace(canonical, Entry{*parsed, &t}).second)
      fail("{}: tensor '{}' appears twice (with and without the adapter name 'default')", where, canonical);
  }
  if (by_name.empty()) fail("{}: the file holds no LoRA tensors", where);
  for (const auto& [name, entry] : by_name) {
    const int64_t layer = entry.name.layer;
    const std::string& module = entry.name.module;
    std::vector<std::string> partners = {adapter_tensor_name(layer, module, true), adapter_tensor_name(layer, module, false)};
    if (out.config.use_dora) partners.push_back(magnitude_tensor_name(layer, module));
    for (const std::string& partner : partners)
      if (!by_name.count(partner))
        fail("{}: tensor '{}' is there but its partner '{}' is missing{}", where, name, partner,
             entry.name.is_magnitude || !out.config.use_dora ? "" : fmt::format(" ({} sets \"use_dora\": true)", kAdapterConfigFile));
    // A magnitude holds one value per output row: lora_B's rows.
    if (entry.name.is_magnitude) {
      const int64_t rows = by_name.at(adapter_tensor_name(layer, module, false)).info->shape[0];
      if (entry.info->shape[0] != rows)
        fail("{}: tensor '{}' has {} values, but {} has {} output rows: a DoRA magnitude vector holds one value per "
             "output row", where, entry.info->name, entry.info->shape[0], adapter_tensor_name(layer, module, false), rows);
    }
  }
  std::vector<const Entry*> order;
  for (const auto& [name, entry] : by_name) order.push_back(&entry);
  const auto part = [](const AdapterTensorName& n) { return n.is_magnitude ? 2 : n.is_a ? 0 : 1; };
  std::sort(order.begin(), order.end(), [&](const Entry* a, const Entry* b) {
    return std::tuple(a->name.layer, module_order(a->name.module), part(a->name)) <
           std::tuple(b->name.layer, module_order(b->name.module), part(b->name));
  });
  for (const Entry* e : order) {
    const TensorInfo& info = *e->info;
    Tensor t = Tensor::empty(e->name.is_magnitude ? Shape{info.shape[0]} : Shape{info.shape[0], info.shape[1]}, DType::F32);
    float* dst = t.data<float>();
    const auto bytes = file.bytes(info);
    const size_t n = static_cast<size_t>(t.numel());
    if (info.dtype == DType::F32) {
      std::memcpy(dst, bytes.data(), n * 4);
    } else {
      for (size_t i = 0; i < n; ++i) {
        uint16_t v;
        std::memcpy(&v, bytes.data() + 2 * i, 2);
        dst[i] = info.dtype == DType::BF16 ? bf16_to_float(v) : f16_to_float(v);
      }
    }
    out.tensors.emplace_back(e->name.peft_name(), std::move(t));
  }
  return out;
}

}  // namespace fsdpq
