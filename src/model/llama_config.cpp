#include "model/llama_config.h"

#include <cerrno>
#include <cstring>
#include <cmath>
#include <fstream>
#include <sstream>

#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

using json = nlohmann::json;

// Upper bounds that keep every product of sizes far inside int64 and catch typos (an extra zero).
constexpr int64_t kMaxWidth = int64_t{1} << 20;        // hidden_size, head_dim, heads
constexpr int64_t kMaxIntermediate = int64_t{1} << 22;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxPositions = int64_t{1} << 30;

std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Typed access to the keys of one JSON object, with messages naming the file and the key.
// A key set to null counts as absent, as transformers treats it.
class Fields {
 public:
  Fields(const json& object, const std::string& where, std::string prefix = "")
      : object_(object), where_(where), prefix_(std::move(prefix)) {}

  const json* get(const std::string& key) const {
    auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }

  int64_t integer(const std::string& key, std::optional<int64_t> fallback, int64_t min, int64_t max) const {
    const json* v = get(key);
    if (!v) {
      if (fallback) return *fallback;
      fail("{}: key '{}{}' is missing (expected an integer from {} to {})", where_, prefix_, key, min, max);
    }
    if (!v->is_number_integer())
      fail("{}: key '{}{}' must be an integer from {} to {}, found {}", where_, prefix_, key, min, max, shown(*v));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(max))
      fail("{}: key '{}{}' must be an integer from {} to {}, found {}", where_, prefix_, key, min, max, shown(*v));
    const int64_t i = v->get<int64_t>();
    if (i < min || i > max)
      fail("{}: key '{}{}' must be an integer from {} to {}, found {}", where_, prefix_, key, min, max, i);
    return i;
  }

  double positive_number(const std::string& key, std::optional<double> fallback) const {
    const json* v = get(key);
    if (!v) {
      if (fallback) return *fallback;
      fail("{}: key '{}{}' is missing (expected a positive number)", where_, prefix_, key);
    }
    if (!v->is_number() || !(v->get<double>() > 0) || !std::isfinite(v->get<double>()))
      fail("{}: key '{}{}' must be a positive number, found {}", where_, prefix_, key, shown(*v));
    return v->get<double>();
  }

  bool boolean(const std::string& key, bool fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_boolean()) fail("{}: key '{}{}' must be true or false, found {}", where_, prefix_, key, shown(*v));
    return v->get<bool>();
  }

  std::string string(const std::string& key, const std::string& fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (!v->is_string()) fail("{}: key '{}{}' must be a string, found {}", where_, prefix_, key, shown(*v));
    return v->get<std::string>();
  }

 private:
  const json& object_;
  const std::string& where_;
  std::string prefix_;
};

RopeScaling read_rope_scaling(const json& scaling, const std::string& key, const std::string& where) {
  if (!scaling.is_object()) fail("{}: key '{}' must be null or an object, found {}", where, key, shown(scaling));
  Fields f(scaling, where, key + ".");
  // Older transformers wrote "type", newer "rope_type".
  std::string type = f.string("rope_type", f.string("type", ""));
  RopeScaling r;
  if (type.empty() || type == "default") return r;
  if (type != "llama3")
    fail("{}: {} type '{}' is not supported (supported: none, llama3); linear, dynamic, yarn and longrope "
         "scaling are not implemented",
         where, key, type);
  r.type = "llama3";
  r.factor = f.positive_number("factor", std::nullopt);
  r.low_freq_factor = f.positive_number("low_freq_factor", std::nullopt);
  r.high_freq_factor = f.positive_number("high_freq_factor", std::nullopt);
  r.original_max_position_embeddings = f.integer("original_max_position_embeddings", std::nullopt, 1, kMaxPositions);
  return r;
}

}  // namespace

LlamaConfig llama_config_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) fail("{}: expected a JSON object, found {}", where, j.type_name());
  if (j.contains("quantization_config") && !j["quantization_config"].is_null())
    fail("{}: has a quantization_config: pre-quantized checkpoints are not supported; give the bf16/fp16 model", where);
  Fields f(j, where);

  LlamaConfig c;
  if (!f.get("model_type")) fail("{}: key 'model_type' is missing (supported: llama, mistral)", where);
  c.model_type = f.string("model_type", "");
  if (c.model_type != "llama" && c.model_type != "mistral")
    fail("{}: model_type '{}' is not supported (supported: llama, mistral)", where, c.model_type);
  const bool mistral = c.model_type == "mistral";

  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu")
    fail("{}: hidden_act '{}' is not supported (supported: silu, which Llama and Mistral use)", where, act);
  if (f.boolean("attention_bias", false))
    fail("{}: attention_bias is true, but fsdpq implements Llama attention without biases", where);
  if (f.boolean("mlp_bias", false)) fail("{}: mlp_bias is true, but fsdpq implements the Llama MLP without biases", where);

  c.hidden_size = f.integer("hidden_size", std::nullopt, 1, kMaxWidth);
  c.intermediate_size = f.integer("intermediate_size", std::nullopt, 1, kMaxIntermediate);
  c.num_hidden_layers = f.integer("num_hidden_layers", std::nullopt, 1, kMaxLayers);
  c.num_attention_heads = f.integer("num_attention_heads", std::nullopt, 1, kMaxWidth);
  c.num_key_value_heads = f.integer("num_key_value_heads", c.num_attention_heads, 1, kMaxWidth);
  c.vocab_size = f.integer("vocab_size", std::nullopt, 1, kMaxVocab);
  // transformers' defaults for keys older configs leave out.
  c.max_position_embeddings = f.integer("max_position_embeddings", mistral ? 4096 * 32 : 2048, 1, kMaxPositions);
  c.rms_norm_eps = f.positive_number("rms_norm_eps", 1e-6);
  c.initializer_range = f.positive_number("initializer_range", 0.02);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);

  if (f.get("head_dim")) {
    c.head_dim = f.integer("head_dim", std::nullopt, 1, kMaxWidth);
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      fail("{}: hidden_size ({}) must be a multiple of num_attention_heads ({}) when head_dim is not given", where,
           c.hidden_size, c.num_attention_heads);
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }

  // transformers 5 moved rope_theta and the scaling into one "rope_parameters" object.
  const json* rope_parameters = f.get("rope_parameters");
  if (rope_parameters && !rope_parameters->is_object())
    fail("{}: key 'rope_parameters' must be null or an object, found {}", where, shown(*rope_parameters));
  double theta_default = 10000.0;
  if (rope_parameters) theta_default = Fields(*rope_parameters, where, "rope_parameters.").positive_number("rope_theta", 10000.0);
  c.rope_theta = f.positive_number("rope_theta", theta_default);
  if (const json* scaling = f.get("rope_scaling"))
    c.rope_scaling = read_rope_scaling(*scaling, "rope_scaling", where);
  else if (rope_parameters)
    c.rope_scaling = read_rope_scaling(*rope_parameters, "rope_parameters", where);

  c.bos_token_id = f.get("bos_token_id") ? f.integer("bos_token_id", std::nullopt, 0, kMaxVocab) : -1;
  c.eos_token_ids.clear();
  if (const json* eos = f.get("eos_token_id")) {
    if (eos->is_array()) {
      for (const json& e : *eos) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0)
          fail("{}: key 'eos_token_id' must be an integer or a list of integers, found {}", where, shown(*eos));
        c.eos_token_ids.push_back(e.get<int64_t>());
      }
    } else if (eos->is_number_integer() && eos->get<int64_t>() >= 0) {
      c.eos_token_ids.push_back(eos->get<int64_t>());
    } else {
      fail("{}: key 'eos_token_id' must be an integer or a list of integers, found {}", where, shown(*eos));
    }
  }
  if (mistral) {
    // MistralConfig's default window is 4096; null turns it off.
    auto it = j.find("sliding_window");
    if (it == j.end())
      c.sliding_window = 4096;
    else if (!it->is_null())
      c.sliding_window = f.integer("sliding_window", std::nullopt, 1, kMaxPositions);
  }
  validate_llama_config(c, where);
  return c;
}

LlamaConfig load_llama_config(const std::filesystem::path& config_json) {
  const std::string where = fmt::format("'{}'", config_json.string());
  std::error_code ec;
  if (!std::filesystem::is_regular_file(config_json, ec)) fail("model config {} does not exist", where);
  std::ifstream in(config_json, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) fail("cannot read model config {}: {}", where, std::strerror(errno));
  json j;
  try {
    j = json::parse(text.str());
  } catch (const json::parse_error& e) {
    fail("{}: not valid JSON (error at byte {})", where, e.byte);
  }
  return llama_config_from_json(j, where);
}

void validate_llama_config(const LlamaConfig& c, const std::string& where) {
  if (c.model_type != "llama" && c.model_type != "mistral")
    fail("{}: model_type '{}' is not supported (supported: llama, mistral)", where, c.model_type);
  auto in_range = [&](const char* key, int64_t v, int64_t max) {
    if (v < 1 || v > max) fail("{}: {} must be an integer from 1 to {}, found {}", where, key, max, v);
  };
  in_range("hidden_size", c.hidden_size, kMaxWidth);
  in_range("intermediate_size", c.intermediate_size, kMaxIntermediate);
  in_range("num_hidden_layers", c.num_hidden_layers, kMaxLayers);
  in_range("num_attention_heads", c.num_attention_heads, kMaxWidth);
  in_range("num_key_value_heads", c.num_key_value_heads, kMaxWidth);
  in_range("head_dim", c.head_dim, kMaxWidth);
  in_range("vocab_size", c.vocab_size, kMaxVocab);
  in_range("max_position_embeddings", c.max_position_embeddings, kMaxPositions);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail("{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", where, c.num_attention_heads,
         c.num_key_value_heads);
  if (c.head_dim % 2 != 0) fail("{}: head_dim ({}) must be even for rotary position embeddings", where, c.head_dim);
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps))
    fail("{}: rms_norm_eps must be a positive number, found {}", where, c.rms_norm_eps);
  if (!(c.rope_theta > 0) || !std::isfinite(c.rope_theta))
    fail("{}: rope_theta must be a positive number, found {}", where, c.rope_theta);
  if (!(c.initializer_range > 0) || !std::isfinite(c.initializer_range))
    fail("{}: initializer_range must be a positive number, found {}", where, c.initializer_range);
  if (!c.rope_scaling.type.empty()) {
    if (c.rope_scaling.type != "llama3")
      fail("{}: rope_scaling type '{}' is not supported (supported: none, llama3)", where, c.rope_scaling.type);
    const RopeScaling& r = c.rope_scaling;
    if (!(r.factor > 0) || !(r.low_freq_factor > 0) || !(r.high_freq_factor > 0) || r.original_max_position_embeddings < 1)
      fail("{}: llama3 rope_scaling needs positive factor, low_freq_factor, high_freq_factor and "
           "original_max_position_embeddings",
           where);
    // The llama3 formula divides by (high - low).
    if (r.high_freq_factor <= r.low_freq_factor)
      fail("{}: llama3 rope_scaling needs high_freq_factor ({}) greater than low_freq_factor ({})", where,
           r.high_freq_factor, r.low_freq_factor);
  }
  if (c.bos_token_id >= c.vocab_size)
    fail("{}: bos_token_id {} is not below vocab_size {}", where, c.bos_token_id, c.vocab_size);
  for (int64_t eos : c.eos_token_ids)
    if (eos < 0 || eos >= c.vocab_size) fail("{}: eos_token_id {} is not below vocab_size {}", where, eos, c.vocab_size);
  if (c.sliding_window && *c.sliding_window < 1)
    fail("{}: sliding_window must be positive, found {}", where, *c.sliding_window);
}

json to_hf_json(const LlamaConfig& c) {
  const bool mistral = c.model_type == "mistral";
  json j = {
      {"architectures", {mistral ? "MistralForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", c.model_type},
      {"attention_dropout", 0.0},
      {"head_dim", c.head_dim},
      {"hidden_act", "silu"},
      {"hidden_size", c.hidden_size},
      {"initializer_range", c.initializer_range},
      {"intermediate_size", c.intermediate_size},
      {"max_position_embeddings", c.max_position_embeddings},
      {"num_attention_heads", c.num_attention_heads},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_key_value_heads", c.num_key_value_heads},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"torch_dtype", "bfloat16"},
      {"use_cache", true},
      {"vocab_size", c.vocab_size},
  };
  if (mistral) {
    j["sliding_window"] = c.sliding_window ? json(*c.sliding_window) : json(nullptr);
  } else {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  if (c.rope_scaling.type.empty()) {
    j["rope_scaling"] = nullptr;
  } else {
    j["rope_scaling"] = {{"rope_type", c.rope_scaling.type},
                         {"factor", c.rope_scaling.factor},
                         {"low_freq_factor", c.rope_scaling.low_freq_factor},
                         {"high_freq_factor", c.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings}};
  }
  j["bos_token_id"] = c.bos_token_id >= 0 ? json(c.bos_token_id) : json(nullptr);
  if (c.eos_token_ids.empty())
    j["eos_token_id"] = nullptr;
  else if (c.eos_token_ids.size() == 1)
    j["eos_token_id"] = c.eos_token_ids[0];
  else
    j["eos_token_id"] = c.eos_token_ids;
  return j;
}

const std::vector<std::string>& linear_module_names() {
  static const std::vector<std::string> names = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::pair<int64_t, int64_t> linear_shape(const LlamaConfig& c, std::string_view module) {
  if (module == "q_proj") return {c.q_out(), c.hidden_size};
  if (module == "k_proj" || module == "v_proj") return {c.kv_out(), c.hidden_size};
  if (module == "o_proj") return {c.hidden_size, c.q_out()};
  if (module == "gate_proj" || module == "up_proj") return {c.intermediate_size, c.hidden_size};
  if (module == "down_proj") return {c.hidden_size, c.intermediate_size};
  if (module == "lm_head") return {c.vocab_size, c.hidden_size};
  std::vector<std::string> known = linear_module_names();
  known.push_back("lm_head");
  std::string guess = closest_match(module, known);
  fail("unknown linear module '{}'{}; known modules: {}", module,
       guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess), join(known, ", "));
}

std::vector<TensorSpec> hf_tensor_specs(const LlamaConfig& c) {
  std::vector<TensorSpec> specs;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    specs.push_back(TensorSpec{std::move(name), DType::BF16, std::move(shape)});
  };
  add("model.embed_tokens.weight", {c.vocab_size, c.hidden_size});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string layer = fmt::format("model.layers.{}.", i);
    auto linear = [&](const std::string& prefix, const char* module) {
      auto [out, in] = linear_shape(c, module);
      add(layer + prefix + module + ".weight", {out, in});
    };
    add(layer + "input_layernorm.weight", {c.hidden_size});
    for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"}) linear("self_attn.", m);
    add(layer + "post_attention_layernorm.weight", {c.hidden_size});
    for (const char* m : {"gate_proj", "up_proj", "down_proj"}) linear("mlp.", m);
  }
  add("model.norm.weight", {c.hidden_size});
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, c.hidden_size});
  return specs;
}

ParamCounts count_params(const LlamaConfig& c) {
  ParamCounts p;
  const int64_t layers = c.num_hidden_layers;
  p.embedding = c.vocab_size * c.hidden_size;
  p.attention = layers * (2 * c.q_out() * c.hidden_size + 2 * c.kv_out() * c.hidden_size);
  p.mlp = layers * 3 * c.intermediate_size * c.hidden_size;
  p.norms = (2 * layers + 1) * c.hidden_size;
  p.lm_head = c.tie_word_embeddings ? 0 : c.vocab_size * c.hidden_size;
  p.total = p.embedding + p.attention + p.mlp + p.norms + p.lm_head;
  return p;
}

}  // namespace fsdpq
