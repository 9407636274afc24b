// `fsdpq merge --model DIR --adapter DIR --out DIR`: folds a PEFT LoRA adapter into its base model
// and writes a plain HF model directory (what PEFT's merge_and_unload + save_pretrained give):
// each adapted linear becomes W + (lora_alpha / r) · B·A, summed in fp32 and rounded to bf16;
// every other tensor is copied (as bf16). One tensor at a time is in memory, so a 70B model merges
// on a machine with a few GB of RAM.
#include <fmt/format.h>
#include <omp.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "app/arg_parser.h"
#include "app/commands.h"
#include "io/model_files.h"
#include "io/output_directory.h"
#include "io/peft_adapter.h"
#include "model/llama_config.h"
#include "model/model_source.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/log.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

const std::vector<FlagSpec> kMergeFlags = {
    {"model", "DIR", "the base model: an HF directory (config.json, safetensors in bf16/f16/f32)", true},
    {"adapter", "DIR", "the LoRA adapter: a PEFT directory (adapter_config.json, adapter_model.safetensors)", true},
    {"out", "DIR", "the merged model directory to create (bf16 safetensors, config.json, tokenizer files)", true},
    {"max_shard_size", "BYTES", "split the weights into files of at most this size (default 5000000000)"},
    {"overwrite", "", "replace DIR if it exists"},
};

// Files of an HF model directory besides the weights that a merged model keeps as they are.
const char* const kCopiedFiles[] = {"generation_config.json", "tokenizer.model", "tokenizer.json",
                                    "tokenizer_config.json", "special_tokens_map.json"};

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("merge: cannot open '{}': {}", path.string(), std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Element `i` of a tensor stored as BF16, F16 or F32 (check_weights_match_config allows only these).
float load_element(const std::byte* data, DType dtype, size_t i) {
  if (dtype == DType::F32) {
    float v;
    std::memcpy(&v, data + 4 * i, 4);
    return v;
  }
  uint16_t v;
  std::memcpy(&v, data + 2 * i, 2);
  return dtype == DType::BF16 ? bf16_to_float(v) : f16_to_float(v);
}

struct AdaptedLinear {
  const Tensor* a = nullptr;  // [r, in]
  const Tensor* b = nullptr;  // [out, r]
  const Tensor* magnitude = nullptr;  // DoRA's m [out]; null for LoRA
};

// Matches every adapter tensor with a weight of the model and checks the shapes; every layer must
// carry every target module (what PEFT creates for a Llama when layers_to_transform is unset).
std::map<std::string, AdaptedLinear> match_adapter(const LlamaConfig& config, const LoadedAdapter& adapter,
                                                   const fs::path& model_dir, const fs::path& adapter_dir) {
  std::map<std::string, AdaptedLinear> adapted;  // base weight name → its adapter
  for (const auto& [name, tensor] : adapter.tensors) {
    const AdapterTensorName parsed = *parse_adapter_tensor_name(name);
    if (parsed.layer >= config.num_hidden_layers)
      fail("merge: adapter tensor '{}' is for layer {}, but the model in '{}' has {} layers (was the adapter "
           "trained on another model?)", name, parsed.layer, model_dir.string(), config.num_hidden_layers);
    const auto [out_features, in_features] = linear_shape(config, parsed.module);
    if (parsed.is_magnitude) {
      if (tensor.shape() != Shape{out_features})
        fail("merge: adapter tensor '{}' has shape {}, but '{}' of the model in '{}' has {} output rows, so the DoRA "
             "magnitude needs [{}]: the adapter was trained on a model of another shape", name,
             tensor.shape().to_string(), parsed.base_weight_name(), model_dir.string(), out_features, out_features);
      adapted[parsed.base_weight_name()].magnitude = &tensor;
      continue;
    }
    const int64_t want0 = parsed.is_a ? adapter.config.r : out_features;
    const int64_t want1 = parsed.is_a ? in_features : adapter.config.r;
    if (tensor.shape()[0] != want0 || tensor.shape()[1] != want1)
      fail("merge: adapter tensor '{}' has shape {}, but '{}' of the model in '{}' is [{}, {}] (out, in), so it "
           "needs [{}, {}]: the adapter was trained on a model of another shape", name, tensor.shape().to_string(),
           parsed.base_weight_name(), model_dir.string(), out_features, in_features, want0, want1);
    AdaptedLinear& entry = adapted[parsed.base_weight_name()];
    (parsed.is_a ? entry.a : entry.b) = &tensor;
  }
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer)
    for (const std::string& module : adapter.config.target_modules) {
      const std::string a = adapter_tensor_name(layer, module, true);
      if (!adapter.find(a))
        fail("merge: adapter '{}' has no '{}', although target_modules lists {} and the model has {} layers",
             adapter_dir.string(), a, module, config.num_hidden_layers);
    }
  return adapted;
}

// W + scaling · B·A for one linear, as bf16: each row of B·A is summed in fp32 over k = 0..r-1 (the
// order PEFT's fp32 matmul would use is unspecified; this one is fixed and thread-independent), then
// added to W in fp32 and rounded once. A zero delta keeps W's bits (also -0.0).
// DoRA folds its magnitude in as PEFT's merge does: W' = (m / ‖W + s·B·A‖_row) ⊙ (W + s·B·A), the
// norm of the merged fp32 row (summed in double), the product rounded once.
void merge_linear(const std::byte* w, DType w_dtype, const AdaptedLinear& lora, float scaling, uint16_t* out) {
  const int64_t rows = lora.b->shape()[0], r = lora.b->shape()[1], cols = lora.a->shape()[1];
  const float* a = lora.a->data<float>();
  const float* b = lora.b->data<float>();
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<size_t>(cols));
#pragma omp for schedule(static)
    for (int64_t o = 0; o < rows; ++o) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k = 0; k < r; ++k) {
        const float bk = b[o * r + k];
        const float* ak = a + k * cols;
        for (int64_t i = 0; i < cols; ++i) acc[static_cast<size_t>(i)] += bk * ak[i];
      }
      double square_sum = 0.0;
      for (int64_t i = 0; i < cols; ++i) {
        const size_t index = static_cast<size_t>(o * cols + i);
        const float base = load_element(w, w_dtype, index);
        const float delta = scaling * acc[static_cast<size_t>(i)];
        float& merged = acc[static_cast<size_t>(i)];
        merged = delta == 0.0f ? base : base + delta;
        square_sum += static_cast<double>(merged) * merged;
      }
      const float factor =
          lora.magnitude ? lora.magnitude->data<float>()[o] / static_cast<float>(std::sqrt(square_sum)) : 1.0f;
      for (int64_t i = 0; i < cols; ++i)
        out[o * cols + i] = float_to_bf16(lora.magnitude ? factor * acc[static_cast<size_t>(i)] : acc[static_cast<size_t>(i)]);
    }
  }
}

struct MergeOptions {
  fs::path model, adapter, out;
  uint64_t max_shard_bytes = kDefaultMaxShardBytes;
  bool overwrite = false;
};

// The output directory: absolute, never the model or adapter itself, empty unless overwriting.
fs::path check_output_dir(const MergeOptions& options) {
  const fs::path target = output_directory_target(options.out, "merge");
  std::error_code ec;
  for (const fs::path& input : {options.model, options.adapter})
    if (fs::exists(target, ec) && fs::equivalent(target, input, ec))
      fail("merge: --out {} is the same directory as the input '{}'; write the merged model elsewhere",
           options.out.string(), input.string());
  check_output_directory_free(target, options.out, options.overwrite, "merge", "pass --overwrite");
  return target;
}

void merge(const MergeOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (starts_with(options.model.string(), "preset:"))
    fail("merge: --model {}: a preset has no weights to merge into; give an HF model directory",
         options.model.string());
  const ModelSource source = open_model_source(options.model.string());  // config.json ⇔ weights checked
  const LlamaConfig& config = source.config;
  const ModelWeights weights = ModelWeights::open(options.model);
  const LoadedAdapter adapter = load_peft_adapter(options.adapter);
  const std::map<std::string, AdaptedLinear> adapted = match_adapter(config, adapter, options.model, options.adapter);
  const float scaling = static_cast<float>(adapter.config.scaling());

  StagedDirectory staging(check_output_dir(options), "merge");

  // Weights, in HF order, all bf16. Only the linear being merged is held in memory.
  const std::vector<TensorSpec> specs = hf_tensor_specs(config);
  size_t cached_index = std::numeric_limits<size_t>::max();
  std::vector<uint16_t> cached;
  auto fill = [&](size_t index, uint64_t byte_offset, std::span<std::byte> chunk) {
    const std::string& name = specs[index].name;
    const TensorInfo& info = *weights.find(name);
    const std::byte* source_bytes = weights.bytes(name).data();
    if (auto it = adapted.find(name); it != adapted.end()) {
      if (cached_index != index) {
        cached.assign(static_cast<size_t>(specs[index].numel()), 0);
        merge_linear(source_bytes, info.dtype, it->second, scaling, cached.data());
        cached_index = index;
      }
      std::memcpy(chunk.data(), reinterpret_cast<const std::byte*>(cached.data()) + byte_offset, chunk.size());
      return;
    }
    if (info.dtype == DType::BF16) {
      std::memcpy(chunk.data(), source_bytes + byte_offset, chunk.size());
      return;
    }
    const size_t first = byte_offset / 2, count = chunk.size() / 2;
    uint16_t* dst = reinterpret_cast<uint16_t*>(chunk.data());
    for (size_t i = 0; i < count; ++i) dst[i] = float_to_bf16(load_element(source_bytes, info.dtype, first + i));
  };
  write_model_weights(staging.path(), specs, fill, options.max_shard_bytes);
  cached = {};

  // config.json as given (keeps every field transformers reads), now describing bf16 weights.
  nlohmann::json hf_config = nlohmann::json::parse(read_text_file(options.model / "config.json"));
  hf_config["torch_dtype"] = "bfloat16";
  if (hf_config.contains("dtype")) hf_config["dtype"] = "bfloat16";  // transformers 5's name
  write_file_atomically(staging.path() / "config.json", hf_config.dump(2) + "\n");
  std::error_code ec;
  for (const char* file : kCopiedFiles) {
    if (!fs::is_regular_file(options.model / file, ec)) continue;
    fs::copy_file(options.model / file, staging.path() / file, ec);
    if (ec)
      fail("merge: cannot copy '{}' into '{}': {}", (options.model / file).string(), staging.path().string(),
           ec.message());
  }

  staging.commit();

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::info("merge: folded {} LoRA pairs (r = {}, scaling lora_alpha / r = {}) into {} and wrote {} in {:.1f} s",
            adapted.size(), adapter.config.r, adapter.config.scaling(), options.model.string(), options.out.string(),
            seconds);
}

}  // namespace

int run_merge_command(const World& world, const std::vector<std::string>& args) {
  if (wants_help(args)) {
    log::info("{}", flags_help("fsdpq merge --model DIR --adapter DIR --out DIR [flags]", kMergeFlags));
    return kExitOk;
  }
  run_on_all_ranks(world, [&] {
    if (world.size > 1)
      fail("fsdpq merge writes files and runs as one process, not under mpirun/srun with {} ranks", world.size);
    const ParsedFlags flags = parse_flags("merge", kMergeFlags, args);
    MergeOptions options;
    options.model = flags.get("model");
    options.adapter = flags.get("adapter");
    options.out = flags.get("out");
    if (flags.has("max_shard_size")) {
      const int64_t v = flags.get_int("max_shard_size", 0);
      if (v < 1024) fail("merge: --max_shard_size {}: must be at least 1024 bytes", v);
      options.max_shard_bytes = static_cast<uint64_t>(v);
    }
    options.overwrite = flags.has("overwrite");
    merge(options);
  });
  return kExitOk;
}

}  // namespace fsdpq
